"""``line.routes``: Line called the chainable object ``bridge.on(...)`` returns a ``RouteBuilder``.

In bargein it is :class:`bargein.agent.routes.Route`; ``RouteBuilder`` is the same class under Line's name,
so annotations and ``isinstance`` checks in migrated code keep working.
"""

from __future__ import annotations

from bargein.agent.routes import Route

RouteBuilder = Route

__all__ = ["Route", "RouteBuilder"]
