"""The broadcast service, the client edge (``docs/protocol.md``); its parts are in :mod:`bargein.edge`."""
