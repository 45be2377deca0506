"""The interruptible agent most tests need, written once.

It is the README's agent with a scripted model: transcripts go into the history, the caller's stop
starts a streamed answer that the caller's speech interrupts (calling the node's
``on_interrupt_generate``), and, when asked, a false interruption resumes the cut-off answer.
"""

from __future__ import annotations

from collections.abc import Callable

from bargein import (
    Bridge,
    FalseInterruption,
    ReasoningNode,
    ScriptedLLM,
    SessionInfo,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)

Agent = Callable[[SessionInfo], Bridge]


def scripted(*replies: str, first_token_delay: float = 0.005, tokens_per_second: float = 100) -> ScriptedLLM:
    """A model that answers with ``replies`` in turn, word by word, fast enough for tests and slow
    enough to be interrupted after a few chunks."""
    return ScriptedLLM(
        list(replies) or None, first_token_delay=first_token_delay, tokens_per_second=tokens_per_second
    )


def interruptible_agent(
    make_node: Callable[[], ReasoningNode] | None = None,
    *,
    replies: tuple[str, ...] = (),
    tokens_per_second: float = 100,
    transcripts: bool = True,
    handler: bool = True,
    resume: bool = False,
) -> Agent:
    """An agent whose node comes from ``make_node`` (default: a :class:`ReasoningNode` on a
    :func:`scripted` model with ``replies``)."""

    def agent(session: SessionInfo) -> Bridge:
        if make_node is not None:
            node = make_node()
        else:
            node = ReasoningNode(llm_client=scripted(*replies, tokens_per_second=tokens_per_second))
        bridge = Bridge(node)
        if transcripts:
            bridge.on(UserTranscriptionReceived).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate if handler else None)
            .stream(node.generate)
            .broadcast()
        )
        if resume:
            bridge.on(FalseInterruption).interrupt_on(UserStartedSpeaking).stream(node.resume).broadcast()
        return bridge

    return agent
