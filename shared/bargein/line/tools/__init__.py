"""``line.tools``: the tool declarations and helpers Line 0.1 shipped (``end_call``, key presses,
transfers) and :class:`ToolDefinition`, their base.

The names Line exported here are here too; ``EndCall`` is the event (``bargein.line.events``), as it
was in Line.
"""

from __future__ import annotations

from bargein.line.tools.system_tools import (
    DTMFToolCall,
    EndCall,
    EndCallArgs,
    EndCallTool,
    TransferToolCall,
    end_call,
)
from bargein.line.tools.tool_types import ToolDefinition

__all__ = [
    "DTMFToolCall",
    "EndCall",
    "EndCallArgs",
    "EndCallTool",
    "ToolDefinition",
    "TransferToolCall",
    "end_call",
]
