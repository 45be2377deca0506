"""Moved to :mod:`bargein.agent.events`; this name keeps ``from bargein.events import ...`` working."""

from bargein.agent.events import *  # noqa: F403
from bargein.agent.events import __all__ as __all__
