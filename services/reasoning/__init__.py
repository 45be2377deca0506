"""The reasoning service: runs ``BARGEIN_AGENT`` for the sessions it owns (:mod:`bargein.hosting`)."""
