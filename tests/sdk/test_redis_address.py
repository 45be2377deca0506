"""``BARGEIN_REDIS_URL`` names a Redis server or the Sentinels of one; a bad URL is refused when
the settings load, with the setting's name, not when the first command fails."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bargein.settings import SENTINEL_PORT, BrokerSettings, SentinelAddress, is_sentinel


def test_a_sentinel_url_names_the_sentinels_the_service_the_database_and_the_passwords() -> None:
    address = SentinelAddress.parse(
        "redis+sentinel://:p%40ss@sentinel-0:26380,[::1],sentinel-2/bargein/3?sentinel_password=s"
    )
    assert address.sentinels == (("sentinel-0", 26380), ("::1", SENTINEL_PORT), ("sentinel-2", SENTINEL_PORT))
    assert (address.service, address.db, address.password, address.sentinel_password) == (
        "bargein",
        3,
        "p@ss",
        "s",
    )
    plain = SentinelAddress.parse("redis+sentinel://s:26379/mymaster")
    assert (plain.db, plain.password, plain.sentinel_password) == (0, None, None)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s:26379/",  # no service
        "redis+sentinel:///bargein",  # no Sentinel
        "redis+sentinel://s:port/bargein",
        "redis+sentinel://s:26379/bargein/zero",
        "redis+sentinel://s:26379/bargein/0/extra",
        "redis+sentinel://s:26379/bargein?password=x",  # unknown option
    ],
)
def test_a_bad_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        SentinelAddress.parse(url)


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://s:26379/", "redis+sentinel://s:26379", "sentinel://s/bargein", "http://redis:6379"],
)
def test_the_settings_refuse_a_url_no_client_could_use(url: str) -> None:
    with pytest.raises(ValidationError, match="redis_url"):
        BrokerSettings(redis_url=url)


def test_server_urls_are_not_sentinel_urls() -> None:
    assert BrokerSettings(redis_url="redis+sentinel://a,b/bargein/1").redis_url
    assert not is_sentinel("redis://localhost:6379/0")
    assert is_sentinel("redis+sentinel://a/bargein")
