"""Finding the agent a service runs: ``BARGEIN_AGENT=module:attr``."""

from __future__ import annotations

import importlib

from bargein.errors import SettingsError
from bargein.runtime import Agent


def load_agent(spec: str) -> Agent:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SettingsError(f"BARGEIN_AGENT must look like module:attribute, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name like ".x"
        raise SettingsError(f"BARGEIN_AGENT={spec!r}: cannot import {module_name!r}: {exc}") from exc
    agent = getattr(module, attr, None)
    if agent is None or not callable(agent):
        raise SettingsError(f"BARGEIN_AGENT={spec!r}: {module_name} has no callable {attr!r}")
    return agent  # type: ignore[no-any-return]
