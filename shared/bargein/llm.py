"""Moved to :mod:`bargein.agent.llm`; this name keeps ``from bargein.llm import ...`` working."""

from bargein.agent.llm import *  # noqa: F403
from bargein.agent.llm import __all__ as __all__
