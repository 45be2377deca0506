"""The agent the Line integration tests' reasoning process runs: a Line-style dispatcher.

``tests.integration.agents:by_option`` cannot start a Line-style agent: it calls ``agent(session)``,
and the runtime recognises a Line-style ``handle_new_call(system, call_request)`` by the signature of
the configured agent, which is ``by_option``'s one parameter. This dispatcher has the two-parameter
signature, so the runtime hands it the ``VoiceAgentSystem`` and ``CallRequest``, and it passes both on
to the ``handle_new_call`` (or ``VoiceAgentApp``) that ``options["agent"]`` names.
"""

from __future__ import annotations

from bargein.hosting.loader import load_agent
from bargein.line import CallRequest, VoiceAgentSystem
from bargein.line.system import is_line_style


async def by_option(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    spec = str(call_request.options["agent"])
    agent = load_agent(spec)
    if not is_line_style(agent):
        raise TypeError(f"{spec} is not a Line-style handle_new_call(system, call_request)")
    await agent(system, call_request)  # type: ignore[call-arg]
