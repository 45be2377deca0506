"""The client edge (broadcast service): HTTP and WebSocket sessions, fan-out with turn fencing,
bounded outboxes, tokens, and the client protocol's frames (see ``docs/protocol.md``)."""
