"""``BARGEIN_RABBITMQ_URL`` as a list of nodes: parsed and refused as a setting, tried in turn at
start-up against the real broker. Moving on to the next node when one dies is the fault test's
(tests/faults/test_cluster.py), on a cluster of private nodes."""

from __future__ import annotations

import logging

import pytest

from bargein.errors import SettingsError
from bargein.settings import BrokerSettings, broker_addresses, load
from bargein.tools.benchkit import free_port
from bargein.transport.amqp import AmqpTransport
from bargein.transport.amqp_address import connect_robust, shown


def test_a_list_of_nodes_is_read_in_order() -> None:
    url = "amqp://u:p@rabbit-0:5672/, amqp://u:p@rabbit-1:5672/,amqps://u:p@rabbit-2:5671/v"
    assert broker_addresses(url) == (
        "amqp://u:p@rabbit-0:5672/",
        "amqp://u:p@rabbit-1:5672/",
        "amqps://u:p@rabbit-2:5671/v",
    )
    assert broker_addresses("amqp://guest:guest@localhost:5672/") == ("amqp://guest:guest@localhost:5672/",)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://a:5672/,,amqp://b:5672/", "an empty address"),
        ("amqp://a:5672/,", "an empty address"),
        ("amqp://a:5672/,redis://b:6379/0", "'redis://b:6379/0' is not an amqp://"),
        ("amqp://a:5672/,amqp:///vhost", "'amqp:///vhost' is not an amqp:// or amqps:// URL with a host"),
    ],
)
def test_a_bad_list_is_refused_naming_the_setting_and_the_address(
    monkeypatch: pytest.MonkeyPatch, url: str, said: str
) -> None:
    monkeypatch.setenv("BARGEIN_RABBITMQ_URL", url)
    with pytest.raises(SettingsError) as refused:
        load(BrokerSettings)
    assert "BARGEIN_RABBITMQ_URL" in str(refused.value) and said in str(refused.value)


def test_an_address_is_logged_without_its_password() -> None:
    assert shown("amqp://bargein:s3cret@rabbit-0:5672/?heartbeat=5") == "amqp://bargein:******@rabbit-0:5672/"


async def test_a_node_that_does_not_answer_is_passed_over_at_start_up(
    rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    with caplog.at_level(logging.WARNING, "bargein.transport.amqp"):
        transport = await AmqpTransport.connect(f"{dead},{rabbitmq_url}", name="bargein-test-addresses")
    try:
        assert transport.connected
        assert transport.address == shown(rabbitmq_url)
        assert f"RabbitMQ at {shown(dead)} did not answer" in caplog.text
    finally:
        await transport.close()


async def test_no_node_answering_is_the_last_ones_error() -> None:
    dead = [f"amqp://guest:guest@127.0.0.1:{free_port()}/" for _ in range(2)]
    with pytest.raises(ConnectionError):
        await connect_robust(",".join(dead))
