"""``line.bridge``: :class:`Bridge`, bargein's own (``on``, ``authorize``) under Line's module path.

``bridge.on(Event, filter_fn=..., **event_property_filters)`` behaves as in Line: a property filter
value is compared to the event's field, or called with it when it is callable. ``filter=`` is
bargein's name for ``filter_fn=``.
"""

from __future__ import annotations

from bargein.agent.routes import Bridge

__all__ = ["Bridge"]
