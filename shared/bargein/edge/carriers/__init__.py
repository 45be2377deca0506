"""Phone carriers' media streams, one module each behind :class:`~.abc.Carrier` (docs/telephony.md)."""
