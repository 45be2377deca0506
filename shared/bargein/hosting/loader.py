"""Finding the agent a service runs: ``BARGEIN_AGENT=module:attr``."""

from __future__ import annotations

import importlib
import logging

from bargein.errors import SettingsError
from bargein.runtime.agents import Agent

log = logging.getLogger("bargein.hosting.loader")

# The example agents shipped under services/reasoning/agents before they moved into the package.
LEGACY_PREFIX = "services.reasoning.agents."
EXAMPLES = "bargein.examples."


def load_agent(spec: str) -> Agent:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SettingsError(f"BARGEIN_AGENT must look like module:attribute, got {spec!r}")
    if module_name.startswith(LEGACY_PREFIX):
        moved = EXAMPLES + module_name.removeprefix(LEGACY_PREFIX)
        log.warning("BARGEIN_AGENT=%s: %s is now %s; loading that", spec, module_name, moved)
        module_name = moved
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: a relative name like ".x"
        raise SettingsError(f"BARGEIN_AGENT={spec!r}: cannot import {module_name!r}: {exc}") from exc
    agent = getattr(module, attr, None)
    if agent is None or not callable(agent):
        raise SettingsError(f"BARGEIN_AGENT={spec!r}: {module_name} has no callable {attr!r}")
    return agent  # type: ignore[no-any-return]
