"""``line.voice_agent_app``: ``app = VoiceAgentApp(handle_new_call)`` and ``app.run()``.

In Line, ``VoiceAgentApp`` was the agent's web server: it accepted Cartesia's HTTP call requests and
ran ``handle_new_call`` for each WebSocket. In bargein that job belongs to the services (the
reasoning service runs the agent for every session it owns, in whichever process owns it), so this
class does two honest things instead of serving HTTP:

* it is itself a Line-style agent: ``BARGEIN_AGENT=my_agent:app bargein reasoning`` runs it (its
  ``pre_call_handler``, if any, runs first for each session and may reject it);
* ``run()`` starts a text conversation in the terminal on the in-process runtime, so
  ``python my_agent.py`` still gives a local trial: each line you type is a user turn, typing while
  the agent is answering barges in, end of input hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TextIO, cast

from bargein.agent.events import (
    AgentError,
    AgentGenerationComplete,
    AgentResponse,
    EndCall,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.errors import SessionRejected
from bargein.line.call_request import PreCallResult
from bargein.line.system import CallRequest, VoiceAgentSystem
from bargein.runtime.agents import Agent
from bargein.tasks import cancel_and_wait
from bargein.testing import LocalSession

CallHandler = Callable[[VoiceAgentSystem, CallRequest], Awaitable[None]]
PreCallHandler = Callable[[CallRequest], Awaitable[PreCallResult | None]]

__all__ = ["CallRejected", "CallRequest", "PreCallResult", "VoiceAgentApp"]


class CallRejected(SessionRejected):
    """The pre-call handler returned None: this session gets no agent (the host ends it)."""


class VoiceAgentApp:
    """Line's application object. Callable as ``app(system, call_request)``, so the reasoning service
    can run it directly; ``run()`` is the local trial described in the module docstring."""

    def __init__(self, call_handler: CallHandler, pre_call_handler: PreCallHandler | None = None) -> None:
        self.call_handler = call_handler
        self.pre_call_handler = pre_call_handler

    async def __call__(self, system: VoiceAgentSystem, call_request: CallRequest) -> None:
        """Run one call: the pre-call handler (which may reject it), then ``handle_new_call``. Both run
        again when another process adopts the session and rebuilds it."""
        if self.pre_call_handler is not None:
            result = await self.pre_call_handler(call_request)
            if result is None:
                raise CallRejected(f"pre_call_handler rejected call {call_request.call_id}")
            call_request.metadata.update(result.metadata)
        await self.call_handler(system, call_request)

    def run(self, host: str = "0.0.0.0", port: int | None = None) -> None:
        """Talk to the agent in this terminal. ``host`` and ``port`` are accepted for Line
        compatibility and unused: nothing listens on the network (the services do that)."""
        print(
            "bargein.line: VoiceAgentApp.run() serves no HTTP; deploy with "
            "`BARGEIN_AGENT=<module>:app bargein reasoning`.\n"
            "Local text trial on the in-process runtime: type a line to speak, type while the agent "
            "answers to barge in, Ctrl-D to hang up.",
            file=sys.stderr,
        )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(self.chat(_stdin_lines(), sys.stdout))

    async def chat(
        self,
        lines: AsyncIterable[str],
        out: TextIO,
        *,
        options: dict[str, Any] | None = None,
        quiet_s: float = 0.5,
    ) -> None:
        """One session: every line from ``lines`` is a caller turn (speech start, transcript, speech
        end); the agent's text is written to ``out`` as it streams. When ``lines`` runs out the
        caller hangs up, once the agent has been silent for ``quiet_s`` (so piped input gets its
        answers); the conversation also ends when the agent sends ``EndCall``."""
        agent = cast(Agent, self)  # a Line-style agent: the runtime recognises its two parameters
        async with LocalSession(agent, options=options) as session:
            printer = _Printer(session, out)
            task = asyncio.create_task(printer.run())
            try:
                await _converse(session, aiter(lines), task, printer, quiet_s)
            finally:
                await cancel_and_wait(task)


async def _converse(
    session: LocalSession,
    lines: AsyncIterator[str],
    printer_task: asyncio.Task[None],
    printer: _Printer,
    quiet_s: float,
) -> None:
    """Turn lines into caller turns until the agent ends the call or the input ends (then hang up
    once the agent is quiet). Waiting for a line never delays the end of a call the agent ended."""
    while True:
        next_line = asyncio.ensure_future(anext(lines))
        await asyncio.wait({next_line, printer_task}, return_when=asyncio.FIRST_COMPLETED)
        if printer_task.done():  # the agent ended the call
            next_line.cancel()
            return
        try:
            text = next_line.result().strip()
        except StopAsyncIteration:
            break
        if text:
            await session.emit(UserStartedSpeaking())  # barges in if the agent is talking
            await session.emit(UserTranscriptionReceived(content=text))
            await session.emit(UserStoppedSpeaking())
    # silence is the absence of an event, so it is polled for
    while not (printer_task.done() or printer.quiet_for(quiet_s, session)):  # noqa: ASYNC110
        await asyncio.sleep(quiet_s / 5)
    if not printer_task.done():
        await session.emit(EndCall(reason="caller hung up"))


class _Printer:
    """Writes what a client would receive until the agent ends the call, and notes when it last
    wrote, so the caller knows when the agent has gone quiet."""

    def __init__(self, session: LocalSession, out: TextIO) -> None:
        self.session = session
        self.out = out
        self.last_output = time.monotonic()

    def quiet_for(self, seconds: float, session: LocalSession) -> bool:
        """Nothing running and nothing received for ``seconds``."""
        return session.runtime.active_turns == 0 and time.monotonic() - self.last_output >= seconds

    async def run(self) -> None:
        while True:
            try:
                event = await self.session.next(timeout=3600)
            except TimeoutError:
                continue
            self.last_output = time.monotonic()
            if isinstance(event, AgentResponse):
                self.out.write(event.content)
            elif isinstance(event, AgentGenerationComplete):
                self.out.write("\n")
            elif isinstance(event, AgentError):
                self.out.write(f"\n[agent error: {event.message}]\n")
            elif isinstance(event, EndCall):
                self.out.write("\n[the agent ended the call]\n")
                self.out.flush()
                return
            self.out.flush()


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines typed on stdin, read by a daemon thread so that a call the agent ends does not wait for
    one more line before the program can exit."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        while True:
            line = sys.stdin.readline()
            try:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            except RuntimeError:  # the conversation is over and its loop closed
                return
            if not line:
                return

    threading.Thread(target=read, name="bargein-line-stdin", daemon=True).start()
    while line := await lines.get():
        yield line
