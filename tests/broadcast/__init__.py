"""The broadcast service's clients: ``bargein call`` and the browser page, against real services."""
