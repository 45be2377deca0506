"""``line.voice_agent_system``: the ``system`` a Line-style ``handle_new_call(system, call_request)``
receives.

It is bargein's :class:`bargein.line.system.VoiceAgentSystem`: ``with_speaking_node(node, bridge)``,
``with_node(node, bridge)``, ``start()``, ``send_initial_message(text)`` and
``wait_for_shutdown()``. The runtime runs ``handle_new_call`` as a task of the session, takes the
bridges once ``start()`` is called, publishes only the speaking bridge's output to the caller and
hands the other bridges' broadcasts to the rest of the session (background reasoning).
``send_initial_message`` sends once per session, even when another process adopts the session and
runs ``handle_new_call`` again; ``wait_for_shutdown`` returns when the session ends or moves.
"""

from __future__ import annotations

from bargein.line.system import VoiceAgentSystem

__all__ = ["VoiceAgentSystem"]
