"""Where RabbitMQ is: one address, or the nodes of a cluster, tried in turn.

``BARGEIN_RABBITMQ_URL`` takes one AMQP URL or several separated by commas, one per node of a
cluster (or of brokers kept as standbys of each other)::

    amqp://user:pw@rabbit-0:5672/,amqp://user:pw@rabbit-1:5672/,amqp://user:pw@rabbit-2:5672/

A process connects to the first node that answers, in the order given. When its connection is
lost, every attempt to reconnect goes to the next node in the list, round and round, until one
answers: a node that died costs the process one failed attempt, not a wait for that node to come
back, and a node that only restarted is found again on the next round. aio-pika's robust connection
then declares the process's topology again on the node it reached and re-subscribes its consumers
(the node's own copy of a replicated queue, or a new queue where none survived).

Each address is a whole URL (user, password, vhost, TLS), so nodes may differ in any of them; the
connection options in the query string (``?heartbeat=...``) are read from the first address only.
Being one setting, the list works wherever a RabbitMQ URL was taken before (services, benches,
tools) through :func:`connect_robust`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import aio_pika
from yarl import URL

from bargein.settings import broker_addresses

log = logging.getLogger("bargein.transport.amqp")


def shown(address: str | URL) -> str:
    """An address as it may be logged: without its password."""
    url = URL(str(address)).with_query(None)
    return str(url.with_password("******") if url.password else url)


class FailoverConnection(aio_pika.RobustConnection):
    """A robust connection over several broker addresses: every loss of the connection, and every
    failed attempt to make it again, moves it on to the next address.

    aio-pika calls :meth:`_on_connection_close` on both (the underlying connection's closing
    callback fires for a failed attempt too) and reads ``url`` afresh for each attempt, so moving
    ``url`` there is all it takes; the reconnecting, restoring and re-subscribing stay aio-pika's."""

    def __init__(self, addresses: Sequence[URL], first: int = 0, **kwargs: Any) -> None:
        self.addresses = tuple(addresses)
        self.at = first % len(self.addresses)
        super().__init__(self.addresses[self.at], **kwargs)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        if len(self.addresses) > 1 and not self._close_called:
            self.at = (self.at + 1) % len(self.addresses)
            self.url = self.addresses[self.at]
            log.debug("RabbitMQ: the next attempt goes to %s", shown(self.url))
        await super()._on_connection_close(closing)

    @property
    def address(self) -> str:
        """The node this connection is on (or trying to reach), without its password."""
        return shown(self.url)


async def connect_robust(
    url: str, *, client_properties: dict[str, Any] | None = None, **options: float | str
) -> FailoverConnection:
    """A robust connection to the first address of ``url`` (see :func:`broker_addresses`) that
    answers, trying each once in order; the last one's error if none does. ``options`` are the
    connection's URL options, set on every address (``heartbeat``, ``reconnect_interval``...)."""
    addresses = [
        URL(address).update_query({name: str(value) for name, value in options.items()})
        for address in broker_addresses(url)
    ]
    error: BaseException | None = None
    for first, address in enumerate(addresses):
        connection = FailoverConnection(addresses, first, client_properties=client_properties)
        try:
            await connection.connect()
        except (ConnectionError, OSError, aio_pika.exceptions.AMQPError) as exc:
            error = exc
            await connection.close()
            if len(addresses) > 1:
                log.warning("RabbitMQ at %s did not answer (%s); trying the next", shown(address), exc)
            continue
        return connection
    assert error is not None
    raise error
