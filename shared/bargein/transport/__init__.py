"""The two seams to the outside world (:mod:`bargein.transport.abc`) and their implementations:
in memory (tests, the demo), RabbitMQ (:mod:`~bargein.transport.amqp`) and Redis
(:mod:`~bargein.transport.redis_store`)."""
