"""What an agent author writes with: events, the bus message, the conversation context, the route
DSL, nodes, LLM clients, and the one place that decides how user callables are called.

This layer knows nothing of the wire, the transports or the runtime: routes here only record and
validate what the author declared; :mod:`bargein.runtime` runs them.
"""
