"""The broadcast service: the client edge (HTTP + WebSocket). See docs/protocol.md."""
