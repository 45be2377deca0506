"""``line.tools.tool_types``: :class:`ToolDefinition`, the base Line's tool declarations share.

A tool declaration describes one function to a model, in each provider's format. bargein's own LLM
client speaks the OpenAI chat format; the other formats are for agents that call a provider
themselves, as Line's examples did.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["ToolDefinition"]


class ToolDefinition(ABC):
    """A tool's name, description and per-provider declarations, all as class methods."""

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

    @classmethod
    @abstractmethod
    def to_anthropic_tool(cls) -> dict[str, object]:
        """An Anthropic tool declaration."""
