"""Streaming language-model clients that stop the moment the caller stops listening.

A voice agent is interrupted all the time: the user barges in, the turn's task is cancelled, and
whatever the model was still saying becomes waste. Every token the server keeps generating after
that costs GPU time and delays the next reply, so the contract here is that *abandoning a stream
ends it at the server*: cancelling the consuming task, or leaving ``async for`` and calling
``aclose()`` on the iterator, closes the HTTP response, which is how an OpenAI-compatible server
(OpenAI, vLLM, Ollama, llama.cpp) learns to stop.

Agents depend only on :class:`LLMClient`, one streaming method yielding :class:`Chunk` objects::

    async for chunk in self.llm_client.generate_stream(messages):
        speak(chunk.text)

A cancellation that lands inside the stream (the consumer is waiting for the next chunk) closes it at
once. One that lands while the consumer awaits something else leaves the stream suspended until the
event loop finalizes it; wrap it in ``contextlib.aclosing(...)`` to have it closed right away.

Two implementations:

* :class:`ScriptedLLM` replays fixed replies word by word at a set pace, with no network, so demos,
  tests and benchmarks are deterministic and the default replies are long enough to interrupt.
* :class:`OpenAICompatibleLLM` streams chat completions from any OpenAI-compatible server.

:func:`llm_from_settings` picks between them from ``BARGEIN_LLM_*`` settings: with no base URL the
scripted client is used, so nothing else needs to be installed or running. :func:`shared_llm` is
the one client a process's sessions share (a node's default).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Self

import openai

from bargein import metrics, tracing
from bargein.errors import BargeinError
from bargein.settings import PREFIX, LLMSettings, load

__all__ = [
    "DEFAULT_REPLIES",
    "Chunk",
    "LLMClient",
    "LLMError",
    "OpenAICompatibleLLM",
    "ScriptedLLM",
    "close_shared_llms",
    "llm_from_settings",
    "shared_llm",
]

Messages = Sequence[Mapping[str, str]]
"""OpenAI-style chat messages: ``[{"role": "user", "content": "..."}, ...]``."""


class LLMError(BargeinError):
    """The language-model server could not be reached, refused the request or broke the stream."""


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed reply text; joining every chunk's ``text`` gives the whole reply."""

    text: str


class LLMClient(Protocol):
    """What an agent needs from a language model: a reply streamed as it is generated."""

    def generate_stream(self, messages: Messages) -> AsyncIterator[Chunk]:
        """Stream the reply to ``messages``. Abandoning the iteration (the consuming task is cancelled,
        or the caller stops and calls ``aclose()``) must stop the generation."""
        ...


DEFAULT_REPLIES: tuple[str, ...] = (
    "Good question! Today looks mostly sunny with a light breeze from the west, a high of around "
    "twenty-two degrees, and only a small chance of a shower late in the evening.",
    "Let me tell you a story. Once upon a time a curious little robot lived in a lighthouse, and "
    "every night it counted the ships sailing past while it dreamed of visiting faraway harbours.",
    "Sure, happy to help with that. First gather everything you need on the table, then take it one "
    "step at a time, and tell me whenever you would like me to slow down or repeat something.",
    "That is a lovely idea for the weekend. If the weather holds you could walk along the river in "
    "the morning, have a picnic in the park at noon, and catch a film in the evening.",
)
"""Replies :class:`ScriptedLLM` cycles through by default: 20-40 words each, so a demo can barge in."""

_TOKEN = re.compile(r"\s*\S+\s*")

_DEFAULT_FIRST_TOKEN_DELAY_S = 0.25
_DEFAULT_TOKENS_PER_SECOND = 20.0


def _split_tokens(text: str) -> list[str]:
    """Split ``text`` into words that keep their surrounding whitespace, so ``"".join`` restores it."""
    tokens = _TOKEN.findall(text)
    if not tokens and text:  # all whitespace
        return [text]
    return tokens


class ScriptedLLM:
    """A deterministic stand-in for a language model.

    ``replies`` is either a sequence, answered in turn (the agent's ``i``-th answer in the
    conversation, i.e. a call whose messages already hold ``i`` assistant messages, gets
    ``replies[i % len(replies)]``; a single ``str`` counts as one reply), or a function of the
    messages. Choosing by the history rather than by a call counter keeps the reply the same when
    another process adopts the session and regenerates a turn. The reply is streamed word by word,
    each word keeping the whitespace after it: ``first_token_delay`` seconds pass before the first
    chunk and ``1 / tokens_per_second`` seconds between chunks. Every wait is an
    ``asyncio.sleep``, so cancellation lands immediately.
    """

    def __init__(
        self,
        replies: Sequence[str] | Callable[[Messages], str] | None = None,
        *,
        first_token_delay: float = _DEFAULT_FIRST_TOKEN_DELAY_S,
        tokens_per_second: float = _DEFAULT_TOKENS_PER_SECOND,
    ) -> None:
        if first_token_delay < 0:
            raise ValueError(f"first_token_delay must be >= 0, got {first_token_delay}")
        if tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second}")
        self._reply_fn: Callable[[Messages], str] | None = None
        self._replies: tuple[str, ...] = ()
        if replies is None:
            self._replies = DEFAULT_REPLIES
        elif isinstance(replies, str):
            self._replies = (replies,)
        elif callable(replies):
            self._reply_fn = replies
        else:
            self._replies = tuple(replies)
            if not self._replies:
                raise ValueError("replies must not be empty")
        self.first_token_delay = first_token_delay
        self.tokens_per_second = tokens_per_second

    @classmethod
    def from_settings(cls, settings: LLMSettings) -> Self:
        """Default replies, paced by ``scripted_first_token_ms`` and ``scripted_tokens_per_s``."""
        return cls(
            first_token_delay=settings.scripted_first_token_ms / 1000.0,
            tokens_per_second=settings.scripted_tokens_per_s,
        )

    def next_reply(self, messages: Messages) -> str:
        """Choose the reply for ``messages`` (:meth:`generate_stream` calls it)."""
        if self._reply_fn is not None:
            reply = self._reply_fn(messages)
        else:
            answered = sum(1 for m in messages if m.get("role") == "assistant")
            reply = self._replies[answered % len(self._replies)]
        return reply

    def generate_stream(self, messages: Messages) -> AsyncGenerator[Chunk, None]:
        return self._stream(self.next_reply(messages))

    async def _stream(self, reply: str) -> AsyncGenerator[Chunk, None]:
        interval = 1.0 / self.tokens_per_second
        for i, token in enumerate(_split_tokens(reply)):
            await asyncio.sleep(self.first_token_delay if i == 0 else interval)
            yield Chunk(text=token)


class OpenAICompatibleLLM:
    """Streams chat completions from an OpenAI-compatible server (OpenAI, vLLM, Ollama, llama.cpp).

    ``base_url`` is the API root, e.g. ``http://localhost:11434/v1``; ``timeout`` is in seconds and
    bounds connecting and each read, so a stalled stream fails instead of hanging a turn. Failures
    surface as :class:`LLMError`. Abandoning a stream closes its HTTP response, so the server stops
    generating. Call :meth:`aclose` when done with the client to release its connection pool.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = "not-needed",
        model: str = "gpt-4o-mini",
        temperature: float | None = 0.7,
        timeout: float = 30.0,
        *,
        max_retries: int = 2,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.temperature = temperature
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
        )

    @classmethod
    def from_settings(cls, settings: LLMSettings) -> Self:
        """Build from ``BARGEIN_LLM_*`` settings; ``llm_base_url`` must be set."""
        if not settings.llm_base_url:
            raise LLMError("BARGEIN_LLM_BASE_URL is not set")
        return cls(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model,
            temperature=settings.llm_temperature,
            timeout=settings.llm_timeout_s,
        )

    async def generate_stream(self, messages: Messages) -> AsyncGenerator[Chunk, None]:
        asked = time.monotonic()
        first = True
        span = tracing.start_span("llm request", model=self.model, messages=len(messages))
        try:
            # The stream's events as they are sent (dicts), not as the SDK's typed chunks: building
            # a typed model of every token cost ~0.3 ms of CPU, most of what streaming an answer
            # costs the reasoning tier (docs/architecture.md, "What a session start costs").
            stream = await self._client.post(
                "/chat/completions",
                body={
                    "model": self.model,
                    "messages": [dict(m) for m in messages],
                    "stream": True,
                    **({} if self.temperature is None else {"temperature": self.temperature}),
                },
                cast_to=object,
                stream=True,
                stream_cls=openai.AsyncStream[object],
            )
        except BaseException as exc:
            if span is not None:
                span.end()
            if isinstance(exc, openai.OpenAIError):
                raise self._error(exc) from exc
            raise
        # However this generator ends (finished, cancelled mid-read, or closed by the caller at a
        # yield), the response is closed, dropping the connection so the server stops generating.
        try:
            async for event in stream:
                text = _delta_text(event)
                if text:
                    if first:
                        first = False
                        waited = time.monotonic() - asked
                        metrics.LLM_FIRST_TOKEN.observe(waited)
                        if span is not None:
                            span.set_attribute("bargein.first_token_ms", round(waited * 1000, 1))
                    yield Chunk(text=text)
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc
        finally:
            await stream.close()
            if span is not None:  # also when the turn was cut off: it shows how far the request got
                span.end()

    async def aclose(self) -> None:
        """Close the underlying HTTP client and its pooled connections."""
        await self._client.close()

    def _error(self, exc: openai.OpenAIError) -> LLMError:
        where = f"LLM server {self.base_url} (model {self.model!r})"
        if isinstance(exc, openai.APIStatusError):
            return LLMError(f"{where} answered HTTP {exc.status_code}: {exc.message}")
        if isinstance(exc, openai.APITimeoutError):
            return LLMError(f"{where} timed out")
        if isinstance(exc, openai.APIConnectionError):
            return LLMError(f"{where} could not be reached: {exc.__cause__ or exc}")
        return LLMError(f"{where} failed: {exc}")


def _delta_text(event: object) -> str | None:
    """The text a streamed chat completion event adds, if any. Servers differ in what else they
    stream (role-only first deltas, usage events with no choices, filter results without a delta):
    only non-empty text counts."""
    choices = event.get("choices") if isinstance(event, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    delta = choice.get("delta") if isinstance(choice, dict) else None
    text = delta.get("content") if isinstance(delta, dict) else None
    return text if isinstance(text, str) and text else None


def llm_from_settings(settings: LLMSettings | None = None) -> LLMClient:
    """The client the settings ask for: :class:`OpenAICompatibleLLM` when ``llm_base_url`` is set,
    otherwise :class:`ScriptedLLM`. ``settings`` defaults to the environment (``BARGEIN_LLM_*``)."""
    if settings is None:
        settings = load(LLMSettings)
    if settings.llm_base_url and settings.llm_base_url.strip():
        return OpenAICompatibleLLM.from_settings(settings)
    return ScriptedLLM.from_settings(settings)


# The clients sessions share, per event loop (an HTTP client's pool belongs to the loop it was made
# in) and per value of the LLM variables (a test may change them; a service never does).
_LLM_VARIABLES = tuple(f"{PREFIX}{name.upper()}" for name in LLMSettings.model_fields)
_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str | None, ...], LLMClient]] = (
    weakref.WeakKeyDictionary()
)


def shared_llm() -> LLMClient:
    """The environment's client, one for every session of the process: what a node without a
    client of its own streams from. A client per session cost each session start 30 ms of CPU
    with an OpenAI-compatible server (its HTTP client's TLS set-up), and a connection pool per
    session that was never closed; one client keeps a few connections warm for all. Outside an
    event loop, a new client (nothing to share it with)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return llm_from_settings()
    key = tuple(os.environ.get(name) for name in _LLM_VARIABLES)
    clients = _shared.setdefault(loop, {})
    client = clients.get(key)
    if client is None:
        client = clients[key] = llm_from_settings()
    return client


async def close_shared_llms() -> None:
    """Close the running loop's shared clients (their pooled connections): a service stopping."""
    for client in _shared.pop(asyncio.get_running_loop(), {}).values():
        aclose = getattr(client, "aclose", None)
        if aclose is not None:
            await aclose()
