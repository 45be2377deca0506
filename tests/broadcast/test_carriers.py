"""The carriers' messages, one at a time: what each protocol says becomes bargein's events, bad
messages are refused with a reason (the stream counts them and goes on), and the line's audio
survives the trip through μ-law and back."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from bargein.edge.carriers.abc import (
    CallerAudio,
    CarrierError,
    Ignored,
    KeyPressed,
    MarkPlayed,
    StreamStarted,
    StreamStopped,
)
from bargein.edge.carriers.codec import LINE_FRAME_BYTES, LineAudio
from bargein.edge.carriers.telnyx import Telnyx
from bargein.edge.carriers.twilio import Twilio
from bargein.settings import TelephonySettings

SETTINGS = TelephonySettings(twilio_auth_token="t")


def test_twilio_messages_become_events() -> None:
    twilio = Twilio(SETTINGS)
    start = {"event": "start", "start": {"streamSid": "MZ1", "callSid": "CA1",
             "customParameters": {"session": "s", "token": "k"}}}  # fmt: skip
    assert twilio.parse(json.dumps(start)) == StreamStarted("MZ1", "CA1", {"session": "s", "token": "k"})
    media = {
        "event": "media",
        "media": {"track": "inbound", "payload": base64.b64encode(b"\xff\x7f").decode()},
    }
    assert twilio.parse(json.dumps(media)) == CallerAudio(b"\xff\x7f")
    assert twilio.parse('{"event": "dtmf", "dtmf": {"digit": "5"}}') == KeyPressed("5")
    assert twilio.parse('{"event": "mark", "mark": {"name": "3.1"}}') == MarkPlayed("3.1")
    assert twilio.parse('{"event": "stop", "stop": {}}') == StreamStopped()
    assert isinstance(twilio.parse('{"event": "connected"}'), Ignored)
    assert json.loads(twilio.clear("MZ1")) == {"event": "clear", "streamSid": "MZ1"}


def test_telnyx_messages_become_events_and_name_no_stream() -> None:
    telnyx = Telnyx(TelephonySettings(telnyx_public_key="x"))
    start = {"event": "start", "stream_id": "st1",
             "start": {"call_control_id": "v3:1", "media_format": {"encoding": "PCMU"}}}  # fmt: skip
    assert telnyx.parse(json.dumps(start)) == StreamStarted("st1", "v3:1")
    assert json.loads(telnyx.mark("st1", "1.0")) == {"event": "mark", "mark": {"name": "1.0"}}
    with pytest.raises(CarrierError, match="PCMA"):
        telnyx.parse(
            json.dumps({**start, "start": {"call_control_id": "v", "media_format": {"encoding": "PCMA"}}})
        )


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        "[1, 2]",
        '{"event": "media", "media": {"payload": "***"}}',
        '{"event": "media", "media": "x"}',
        '{"event": "start", "start": {"callSid": "CA"}}',
        '{"event": "mark", "mark": {}}',
        '{"event": "surprise"}',
    ],
)
def test_a_bad_message_is_refused_with_a_reason(message: str) -> None:
    for carrier in (Twilio(SETTINGS), Telnyx(SETTINGS)):
        with pytest.raises(CarrierError):
            carrier.parse(message)


def test_the_line_keeps_speech_through_mu_law_and_back() -> None:
    line = LineAudio()
    tone = (np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 8000).astype("<i2")
    frames = [f for i in range(0, len(tone), 320) for f in line.to_line(tone[i : i + 320].tobytes())]
    assert frames and all(len(f) == LINE_FRAME_BYTES for f in frames)  # whole 20 ms frames only
    caller = LineAudio()  # the other end: one stream, its resampler's state kept across frames
    back = np.frombuffer(b"".join(caller.from_line(f) for f in frames), dtype="<i2").astype(float)
    assert abs(np.sqrt(np.mean(back[1600:] ** 2)) - 8000 / np.sqrt(2)) < 800  # the tone's loudness kept
    spectrum = np.abs(np.fft.rfft(back[1600:9600]))
    assert abs(np.argmax(spectrum) * 16000 / 8000 - 440) < 10  # ... and its pitch
