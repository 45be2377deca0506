"""Calling user code that may be sync or async and may or may not take the message.

Line 0.1 documented async handlers and zero-argument handlers but called everything one way; these
helpers are the one place that decides how a user callable is invoked, and they check arity when a
route is declared so a wrong signature fails there, not mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, cast

from bargein.errors import RouteError


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return None


_ACCEPTS: weakref.WeakKeyDictionary[Any, dict[int, bool]] = weakref.WeakKeyDictionary()


def accepts(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with exactly ``n`` positional arguments. Remembered per
    function (a bound method by its function), as every step of every streamed chunk asks."""
    target, count = (fn.__func__, n + 1) if inspect.ismethod(fn) else (fn, n)
    try:
        known = _ACCEPTS.setdefault(target, {})
    except TypeError:  # not weakly referable (a builtin): ask every time
        return _accepts(fn, n)
    if count not in known:
        known[count] = _accepts(fn, n)
    return known[count]


def _accepts(fn: Callable[..., Any], n: int) -> bool:
    sig = _signature(fn)
    if sig is None:
        return True
    try:
        sig.bind(*([None] * n))
    except TypeError:
        return False
    return True


def check_callable(fn: Any, what: str, *, allow_zero: bool) -> Callable[..., Any]:
    """Validate a map/filter/handler/condition at declaration time."""
    if not callable(fn):
        raise RouteError(f"{what} must be callable, got {fn!r}")
    if accepts(fn, 1) or (allow_zero and accepts(fn, 0)):
        return cast(Callable[..., Any], fn)
    takes = "one argument (the message) or none" if allow_zero else "one argument"
    raise RouteError(f"{what} {_name(fn)} must take {takes}; its signature is {_signature(fn)}")


def is_generator_function(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - a callable object's method
    return call is not None and (inspect.isasyncgenfunction(call) or inspect.isgeneratorfunction(call))


async def call_flexible(fn: Callable[..., Any], arg: Any) -> Any:
    """Call ``fn(arg)`` or ``fn()`` (whichever it takes) and await the result if it is awaitable."""
    result = fn(arg) if accepts(fn, 1) else fn()
    if inspect.isawaitable(result):
        result = await result
    return result


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


async def close_generator(gen: Any, exc: BaseException) -> None:
    """Finish an async generator that was suspended at a ``yield`` when ``exc`` hit its consumer.

    For a cancellation the generator is shown ``CancelledError`` at that point (what the seed's
    nodes catch to clean up) instead of a bare ``GeneratorExit``; then it is closed either way, so
    nothing it holds (an HTTP stream to the LLM, say) outlives the turn.
    """
    if isinstance(exc, asyncio.CancelledError):
        with contextlib.suppress(BaseException):
            await gen.athrow(asyncio.CancelledError())
    with contextlib.suppress(RuntimeError):  # "generator ignored GeneratorExit": nothing more to do
        await gen.aclose()
