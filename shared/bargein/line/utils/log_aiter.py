"""``line.utils.log_aiter``: timing logs for coroutines, async generators and blocks.

Latency is what a voice agent is judged on, and most of it is spent waiting for a model: the time
to the first token matters more than the total. These decorators log when a call starts and ends,
and for an async generator the time to its first item and between items, so a slow step shows up
in the logs without a profiler.

Line logged with loguru; bargein logs with the standard ``logging`` module (logger
``bargein.line.utils.log_aiter``, level INFO), which the services already configure. The lines keep
Line's tags (``[START FUNC]``, ``[END ITER]``, ...) and field names, so searches written for Line's
logs still find them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

__all__ = ["context_log", "log_afunc", "log_aiter_func"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def log_afunc(
    log_result: bool = False, message: str | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Decorate an async function to log its start and, when it returns, how long it took.

    ``message`` names the call in the log (default: the function's name); ``log_result`` also logs
    what it returned. A call that raises logs its start only and lets the error through.
    """

    def decorate(func: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        label = message or getattr(func, "__name__", repr(func))

        @functools.wraps(func)
        async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            log.info("[START FUNC] %s", label)
            started = time.monotonic()
            result = await func(*args, **kwargs)
            log.info("[END FUNC] %s. elapsed_time=%.2fs", label, time.monotonic() - started)
            if log_result:
                log.info("[RESULT FUNC] %s. result=%r", label, result)
            return result

        return timed

    return decorate


def log_aiter_func(
    message: str | None = None, show_each: bool = False
) -> Callable[[Callable[P, AsyncIterator[T]]], Callable[P, AsyncIterator[T]]]:
    """Decorate an async generator function to log its start, the time to its first item, and a
    summary when it ends (however it ends: exhausted, failed, closed early or cancelled).

    ``message`` names it in the log (default: the function's name); ``show_each`` puts the time
    between consecutive items in the summary.
    """

    def decorate(func: Callable[P, AsyncIterator[T]]) -> Callable[P, AsyncIterator[T]]:
        label = message or getattr(func, "__name__", repr(func))

        @functools.wraps(func)
        async def timed(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
            log.info("[START ITER] %s", label)
            started = last = time.monotonic()
            gaps: list[float] = []
            try:
                async for item in func(*args, **kwargs):
                    now = time.monotonic()
                    gaps.append(round(now - last, 2))
                    last = now
                    if len(gaps) == 1:
                        log.info("[FIRST_ITEM ITER] %s. time_to_first_item=%.2fs", label, gaps[0])
                    yield item
            except Exception as exc:
                log.exception("[ERROR] %s. %s", label, exc)
                raise
            finally:
                first = f"{gaps[0]:.2f}s" if gaps else "0s"
                log.info(
                    "[END ITER] %s. items_yielded_count=%d, total_time=%.2fs, time_to_first_item=%s,"
                    " iter_timings=%s",
                    label,
                    len(gaps),
                    time.monotonic() - started,
                    first,
                    gaps if show_each else [],
                )

        return timed

    return decorate


@contextmanager
def context_log(message: str) -> Iterator[None]:
    """Log ``[START] message`` on entry and ``[EXIT] message. duration=...`` on exit, with the error
    logged too if the block raised."""
    log.info("[START] %s", message)
    started = time.monotonic()
    try:
        yield
    except Exception as exc:
        log.exception("[ERROR] %s. duration=%.2fs. %s", message, time.monotonic() - started, exc)
        raise
    finally:
        log.info("[EXIT] %s. duration=%.2fs", message, time.monotonic() - started)
