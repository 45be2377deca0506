"""``line.tools.tool_types``: :class:`ToolDefinition`, the base Line's tool declarations share.

A tool declaration describes one function to a model, in each provider's format. bargein's own LLM
client speaks the OpenAI chat format; the other formats are for agents that call a provider
themselves, as Line's examples did.

The abstract methods are exactly Line's four (``name``, ``description``, ``to_gemini_tool``,
``to_openai_tool``), so a tool class written for Line, or a subclass of one, can be instantiated
here unchanged. ``to_anthropic_tool`` is bargein's addition and therefore not abstract: by default
it is derived from ``to_openai_tool`` (same name, description and JSON schema), and it works on the
class for Line's class-method tools and on the instance for per-instance ones such as
``TransferToolCall``.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["ToolDefinition", "anthropic_tool_from_openai", "gemini_function_tool"]

R = TypeVar("R")


class _ClassOrInstanceMethod(Generic[R]):
    """A method bound to the instance when looked up on one, else to the class: a default that
    calls the other methods whichever way a subclass defined them (class or instance methods)."""

    def __init__(self, func: Callable[[Any], R]) -> None:
        self._func = func
        self.__doc__ = func.__doc__

    def __get__(self, instance: object | None, owner: type | None = None) -> Callable[[], R]:
        return functools.partial(self._func, owner if instance is None else instance)


def anthropic_tool_from_openai(tool: Mapping[str, Any]) -> dict[str, object]:
    """An Anthropic tool declaration (``name``, ``description``, ``input_schema``) with the same
    content as an OpenAI one, in the Responses format or the chat completions one (``function``)."""
    function: Mapping[str, Any] = tool.get("function", tool)
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}})
    schema.pop("strict", None)  # an OpenAI option, not JSON schema
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "input_schema": schema,
    }


def gemini_function_tool(name: str, description: str, parameters: dict[str, Any]) -> Any:
    """A ``google.genai.types.Tool`` declaring one function; needs the ``google-genai`` package
    (bargein's ``line`` extra), imported only here so the tools work without it otherwise."""
    try:
        from google.genai import types
    except ImportError as exc:
        raise ImportError(
            f"{name}: to_gemini_tool() needs the google-genai package (pip install 'bargein[line]')"
        ) from exc
    declaration = types.FunctionDeclaration(name=name, description=description, parameters=parameters)
    return types.Tool(function_declarations=[declaration])


class ToolDefinition(ABC):
    """A tool's name, description and per-provider declarations (class methods in Line; a subclass
    may make them instance methods when each instance declares a different tool)."""

    @classmethod
    @abstractmethod
    def name(cls) -> str:
        """The function name the model calls."""

    @classmethod
    @abstractmethod
    def description(cls) -> str:
        """What the tool does, for the model."""

    @classmethod
    @abstractmethod
    def to_gemini_tool(cls) -> Any:
        """A ``google.genai.types.Tool``."""

    @classmethod
    @abstractmethod
    def to_openai_tool(cls) -> dict[str, object]:
        """An OpenAI function-tool declaration."""

    @_ClassOrInstanceMethod
    def to_anthropic_tool(self: Any) -> dict[str, object]:
        """An Anthropic tool declaration, derived from :meth:`to_openai_tool` unless overridden."""
        return anthropic_tool_from_openai(self.to_openai_tool())
