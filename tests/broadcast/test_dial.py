"""``bargein dial`` places an outbound call through the carrier's REST API (a stand-in server
that speaks the documented request: Twilio's ``POST /2010-04-01/Accounts/{sid}/Calls.json`` with
basic auth and a form; Telnyx's ``POST /v2/texml/calls/{connection_id}`` with a bearer key and
JSON), and the call it asks for fetches the edge's voice webhook once answered."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from urllib.parse import parse_qs

from tests.carrier import CarrierApi
from tests.loopback import Loopback


def dial(api: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BARGEIN_")}
    settings = dict(
        BARGEIN_TWILIO_ACCOUNT_SID="AC123",
        BARGEIN_TWILIO_AUTH_TOKEN="secret-token",
        BARGEIN_TWILIO_API_URL=api,
        BARGEIN_TELNYX_API_KEY="KEY123",
        BARGEIN_TELNYX_CONNECTION_ID="texml-app-1",
        BARGEIN_TELNYX_API_URL=api,
        BARGEIN_PUBLIC_URL="https://agent.example.com",
    )
    environment.update({**settings, **env})
    return subprocess.run(
        [sys.executable, "-m", "bargein", "dial", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dial_places_a_twilio_call_that_fetches_the_edges_webhook() -> None:
    CarrierApi.requests.clear()
    with Loopback(CarrierApi) as server:
        api = server.url.removesuffix("/v1")
        done = dial(api, "+15551230000", "--from", "+15559870000")
    assert done.returncode == 0, done.stderr
    assert "call CAdialled: queued" in done.stdout
    (request,) = CarrierApi.requests
    assert request["auth"] == "Basic " + base64.b64encode(b"AC123:secret-token").decode()
    form = {k: v[0] for k, v in parse_qs(request["body"]).items()}
    assert form["To"] == "+15551230000" and form["From"] == "+15559870000"
    assert form["Url"] == "https://agent.example.com/v1/twilio/voice" and form["Method"] == "POST"


def test_dial_places_a_telnyx_call_too() -> None:
    CarrierApi.requests.clear()
    with Loopback(CarrierApi) as server:
        done = dial(
            server.url.removesuffix("/v1"), "+15551230000", "--from", "+15559870000", "--carrier", "telnyx"
        )
    assert done.returncode == 0, done.stderr
    (request,) = CarrierApi.requests
    assert request["auth"] == "Bearer KEY123"
    assert json.loads(request["body"])["Url"] == "https://agent.example.com/v1/telnyx/voice"


def test_dial_refuses_a_number_that_is_not_e164_and_a_carrier_that_refuses() -> None:
    done = dial("http://127.0.0.1:1", "5551230000", "--from", "+15559870000")
    assert done.returncode == 2 and "E.164" in done.stderr
    CarrierApi.requests.clear()
    with Loopback(CarrierApi) as server:
        refused = dial(server.url.removesuffix("/v1"), "+15551230000", "--from", "+15559870000",
                       BARGEIN_TWILIO_ACCOUNT_SID="ACother")  # fmt: skip
    assert refused.returncode == 1 and "refused" in refused.stderr, refused.stderr
