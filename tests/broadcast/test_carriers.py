"""The carriers' messages, one at a time: what each protocol says becomes bargein's events, bad
messages are refused with a reason (the stream counts them and goes on), and the line's audio
survives the trip through μ-law and back."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

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
    Webhook,
)
from bargein.edge.carriers.codec import (
    G722,
    LINE_FRAME_BYTES,
    LineAudio,
    decode_ulaw,
    encode_alaw,
    encode_ulaw,
)
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
             "start": {"call_control_id": "v3:1", "media_format": {"encoding": "PCMU"},
                       "custom_parameters": {"session": "s", "token": "k"}}}  # fmt: skip
    assert telnyx.parse(json.dumps(start)) == StreamStarted("st1", "v3:1", {"session": "s", "token": "k"})
    assert json.loads(telnyx.mark("st1", "1.0")) == {"event": "mark", "mark": {"name": "1.0"}}


def test_a_telnyx_call_in_a_law_is_taken_and_one_in_another_codec_is_refused_saying_why() -> None:
    telnyx = Telnyx(TelephonySettings(telnyx_public_key="x"))

    def start(encoding: str) -> str:
        return json.dumps({"event": "start", "stream_id": "st1", "start": {
            "call_control_id": "v3:1", "media_format": {"encoding": encoding, "sample_rate": 8000},
            "custom_parameters": [{"name": "session", "value": "s"}]}})  # fmt: skip

    assert telnyx.parse(start("PCMA")) == StreamStarted("st1", "v3:1", {"session": "s"}, encoding="PCMA")
    assert telnyx.parse(start("G722")) == StreamStarted("st1", "v3:1", {"session": "s"}, encoding="G722")
    for other in ("OPUS", "AMR-WB"):
        with pytest.raises(CarrierError, match=rf"{other}.*PCMU, PCMA, G722 \(set the number's codecs"):
            telnyx.parse(start(other))


def test_the_caller_token_is_a_stream_parameter_never_in_a_url_and_the_status_is_asked_for() -> None:
    for carrier in (Twilio(SETTINGS), Telnyx(SETTINGS)):
        markup, _ = carrier.answer("wss://edge/v1/x/media", "https://edge/v1/x/status", "sess-1", "tok-1")
        stream = ET.fromstring(markup).find("./Connect/Stream")
        assert stream is not None, markup
        assert stream.attrib["url"] == "wss://edge/v1/x/media", markup  # nothing in its query
        assert stream.attrib["statusCallback"] == "https://edge/v1/x/status", markup
        parameters = {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
        assert parameters == {"session": "sess-1", "token": "tok-1"}, markup
    telnyx_stream = ET.fromstring(Telnyx(SETTINGS).answer("wss://e", "https://e", "s", "t")[0])
    assert telnyx_stream.find("./Connect/Stream").attrib["codec"] == "PCMU"  # type: ignore[union-attr]


def _status(body: bytes, **form: str) -> Webhook:
    return Webhook("https://edge/v1/x/status", {}, body, form)


def test_status_callbacks_say_when_a_call_is_over_and_only_then() -> None:
    for carrier in (Twilio(SETTINGS), Telnyx(SETTINGS)):
        for status in ("completed", "busy", "failed", "no-answer", "canceled"):
            ended = carrier.call_ended(_status(b"", CallSid="CA1", CallStatus=status))
            assert ended is not None and ended.call_id == "CA1" and status in ended.why
        for status in ("queued", "ringing", "in-progress"):
            assert carrier.call_ended(_status(b"", CallSid="CA1", CallStatus=status)) is None
        stream_error = carrier.call_ended(_status(b"", CallSid="CA1", StreamEvent="stream-error",
                                                  StreamError="could not connect"))  # fmt: skip
        assert stream_error is not None and "could not connect" in stream_error.why
        assert carrier.call_ended(_status(b"", CallSid="CA1", StreamEvent="stream-started")) is None
        with pytest.raises(CarrierError, match="CallSid"):
            carrier.call_ended(_status(b"", CallStatus="completed"))
    telnyx = Telnyx(SETTINGS)

    def event(kind: str, **payload: str) -> Webhook:
        return _status(json.dumps({"data": {"event_type": kind, "payload": payload}}).encode())

    hangup = telnyx.call_ended(event("call.hangup", call_control_id="v3:9", hangup_cause="normal_clearing"))
    assert hangup is not None and hangup.call_id == "v3:9" and "normal_clearing" in hangup.why
    assert telnyx.call_ended(event("call.answered", call_control_id="v3:9")) is None
    with pytest.raises(CarrierError):
        telnyx.call_ended(event("call.hangup"))


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


def test_the_line_holds_the_audio_back_a_few_milliseconds_each_way() -> None:
    """A click said in one 20 ms frame comes out within 5 ms of where it was, at once (soxr's
    stream held it back 80 ms each way: 0.2 s on a phone turn)."""
    for encoding, rate, convert in (("PCMU", 8000, "from_line"), ("PCMU", 16000, "to_line")):
        line = LineAudio(encoding)
        frame = rate // 50
        click = np.zeros(rate, dtype="<i2")
        click[rate // 4 + 7] = 20000
        out = bytearray()
        for i in range(0, rate, frame):
            chunk = click[i : i + frame].tobytes()
            if convert == "from_line":
                out += line.from_line(encode_ulaw(chunk))
            else:
                out += b"".join(decode_ulaw(f) for f in line.to_line(chunk))
            heard = np.abs(np.frombuffer(bytes(out), dtype="<i2"))
            if len(heard) and heard.max() > 2000:
                break
        out_rate = 16000 if convert == "from_line" else 8000
        said_at_s, came_at_s = (rate // 4 + 7) / rate, int(np.argmax(heard)) / out_rate
        assert abs(came_at_s - said_at_s) < 0.005, (convert, said_at_s, came_at_s)
        # out with its own frame; towards the line, perhaps the next (only whole 20 ms frames go out)
        frames_waited = 1 if convert == "from_line" else 2
        assert (i + frame) / rate - said_at_s < 0.02 * frames_waited + 0.005, (convert, i)


def test_the_agents_voice_is_filtered_before_the_line_so_nothing_above_4_khz_folds_back() -> None:
    line = LineAudio()
    tone = (np.sin(np.arange(16000) * 2 * np.pi * 6000 / 16000) * 8000).astype("<i2")
    frames = [f for i in range(0, len(tone), 320) for f in line.to_line(tone[i : i + 320].tobytes())]
    folded = np.frombuffer(decode_ulaw(b"".join(frames)), dtype="<i2").astype(float)
    assert np.sqrt(np.mean(folded[800:] ** 2)) < 0.05 * 8000 / np.sqrt(2)  # -26 dB or better


def test_g722_from_the_line_is_decoded_at_16_khz_packet_after_packet() -> None:
    """An HD-voice call's wideband audio: a 6 kHz tone (beyond what 8 kHz G.711 carries) comes
    through at its pitch and loudness, decoded 20 ms packet by 20 ms packet as a carrier sends it."""
    tone = (np.sin(np.arange(16000) * 2 * np.pi * 6000 / 16000) * 8000).astype("<i2")
    encoder = G722("w")
    packets = [encoder.encode(tone[i : i + 320].tobytes()) for i in range(0, len(tone), 320)]
    assert {len(p) for p in packets} == {160}  # 64 kbit/s: 160 bytes a 20 ms packet
    line = LineAudio("G722")
    heard = np.frombuffer(b"".join(line.from_line(p) for p in packets), dtype="<i2").astype(float)
    assert len(heard) == len(tone)  # 16 kHz, nothing lost or resampled
    rms = float(np.sqrt(np.mean(heard[1600:] ** 2)))
    assert abs(rms - 8000 / np.sqrt(2)) < 1200, rms
    spectrum = np.abs(np.fft.rfft(heard[1600:9600]))
    assert abs(np.argmax(spectrum) * 16000 / 8000 - 6000) < 10


def test_a_law_from_the_line_is_decoded_as_a_law() -> None:
    tone = (np.sin(np.arange(8000) * 2 * np.pi * 440 / 8000) * 8000).astype("<i2")
    heard = np.frombuffer(LineAudio("PCMA").from_line(encode_alaw(tone.tobytes())), dtype="<i2")
    misread = np.frombuffer(LineAudio("PCMU").from_line(encode_alaw(tone.tobytes())), dtype="<i2")
    rms = lambda x: float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))  # noqa: E731
    assert abs(rms(heard) - rms(tone)) < 0.1 * rms(tone)  # the tone's loudness, kept
    assert abs(rms(misread) - rms(tone)) > 0.3 * rms(tone)  # read as μ-law it is noise of another level
