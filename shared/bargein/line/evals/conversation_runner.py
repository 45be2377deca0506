"""``line.evals.conversation_runner``: testing a reasoning node against a scripted conversation.

:class:`ConversationRunner` plays the user turns of an expected conversation to a node's
``process_context``, one at a time, and checks each answer against the expected agent turn. The
node is called directly, without a session, a bus or a model of the caller's timing, so the test
is about what the node says and does, not about the runtime (``bargein.testing.LocalSession`` is
for that). The history each call gets is the expected conversation so far, with the node's own
earlier answers in place of the expected ones, as in Line. An answer's text chunks are joined into
one ``AgentResponse`` there, as the node's history holds an answer in a session (Line's runner kept
the chunks apart, which a node never sees outside the runner).

As in a real turn, the context is also the node's ``self.context`` and what
``bargein.messages`` shows while ``process_context`` runs, so nodes written against bargein's
native API can be tested the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bargein.agent.context import ConversationContext, set_current_context
from bargein.agent.events import AgentResponse, Event
from bargein.agent.nodes import ReasoningNode
from bargein.line.evals.similarity_utils import is_similar_text
from bargein.line.evals.turn import Turn

__all__ = ["ConversationRunner"]


class ConversationRunner:
    """Runs ``expected_conversation`` (alternating user and agent turns, ending with the agent's)
    through ``reasoning_node`` and raises ``AssertionError`` at the first agent turn that does not
    match.

    A conversation may open with the agent's turn (a greeting), which is put in the history as it
    stands; ``initial_agent_message``, if given, must match it. ``test_note`` is added to every
    failure message.
    """

    def __init__(
        self,
        reasoning_node: ReasoningNode,
        expected_conversation: Sequence[Turn],
        initial_agent_message: str | None = None,
        test_note: str | None = None,
    ) -> None:
        self.reasoning_node = reasoning_node
        self.expected_conversation = list(expected_conversation)
        self.initial_agent_message = initial_agent_message
        self.test_note = test_note

    def _with_note(self, text: str) -> str:
        return text if self.test_note is None else f"{text}\nTest notes: {self.test_note}"

    def _verify_conversation_pattern(self) -> None:
        """Raise ``ValueError`` unless the turns alternate and the last is the agent's."""
        turns = self.expected_conversation
        if not turns:
            return
        if not turns[-1].is_agent:
            raise ValueError(self._with_note("Conversation must end with agent turn."))
        for i in range(1, len(turns)):
            if turns[i].role == turns[i - 1].role:
                raise ValueError(
                    self._with_note(
                        f"Invalid conversation pattern at position {i}: two consecutive "
                        f"'{turns[i].role}' turns; user and agent turns must alternate."
                    )
                )

    def _verify_initial_agent_message(self) -> list[Event] | None:
        """The opening agent turn's events, or None if the conversation opens with the user.
        Raises ``AssertionError`` if ``initial_agent_message`` does not match that turn."""
        if not self.expected_conversation or not self.expected_conversation[0].is_agent:
            return None
        opening = self.expected_conversation[0]
        message = self.initial_agent_message
        if message is None or opening.text == message:
            return opening.to_events()
        result = is_similar_text(message, opening.text)  # any of the texts the turn lists
        if result.is_success:
            return opening.to_events()
        raise AssertionError(
            self._with_note(
                "Initial agent message doesn't match expected first AgentTurn.\n"
                f"Provided initial_agent_message: '{message}'\n"
                f"Expected first AgentTurn text: '{opening.text}'\n"
                f"Similarity error: {result.error}"
            )
        )

    async def _answer(self, context: ConversationContext) -> list[Event]:
        # Its own task, so the current-context variable set for the node stays in that task.
        async def collect() -> list[Event]:
            self.reasoning_node.context = context
            set_current_context(context)
            return [event async for event in self.reasoning_node.process_context(context)]

        return await asyncio.create_task(collect())

    async def run(self) -> None:
        """Play the conversation. Raises ``ValueError`` for a conversation that does not alternate
        or does not end with the agent, ``AssertionError`` for an answer that does not match."""
        self._verify_conversation_pattern()
        history: list[Event] = []
        opening = self._verify_initial_agent_message()
        turns = self.expected_conversation
        i = 0
        if opening is not None:
            history.extend(opening)
            i = 1
        while i < len(turns):
            user_turn, expected = turns[i], turns[i + 1]
            history.extend(user_turn.to_events())
            context = ConversationContext(
                events=list(history), system_prompt=self.reasoning_node.system_prompt
            )
            produced = await self._answer(context)
            actual = Turn.from_events(produced)
            problem = expected.is_similar(actual)
            if problem is not None:
                raise AssertionError(
                    self._with_note(
                        "Agent turn doesn't match expected.\n"
                        f"  User message: {user_turn.text}\n"
                        f"  Expected:     {expected}\n"
                        f"  Actual:       {actual}\n"
                        f"  Reason:       {problem}\n"
                    )
                )
            _extend_history(history, produced)
            i += 2


def _extend_history(history: list[Event], produced: list[Event]) -> None:
    """Append an answer, its consecutive text chunks joined (as ``ReasoningNode`` keeps them)."""
    for event in produced:
        last = history[-1] if history else None
        if type(event) is AgentResponse and type(last) is AgentResponse:
            history[-1] = AgentResponse(content=last.content + event.content, chunk_type=last.chunk_type)
        else:
            history.append(event)
