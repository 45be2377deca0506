"""Phone calls over real services, from a simulated carrier written to Twilio's (and Telnyx's)
published protocol (tests/carrier.py): the caller's μ-law reaches the agent as words, the answer
comes back as μ-law with a mark after each word, a barge-in clears the line and the agent's
history keeps only what the carrier said was played, key presses reach the agent, a hang-up ends
the session on every tier, and forged webhooks, tokens and streams are refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import numpy as np
import pytest
import websockets
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bargein.edge.tokens import Tokens
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import TIER_REASONING, TIER_SPEECH
from tests.broadcast.test_voice import ALPHABET, history, speech_of
from tests.carrier import (
    CarrierApi,
    MediaStream,
    TelnyxStream,
    from_line,
    ring,
    ring_telnyx,
    streamed,
    telnyx_event,
    twilio_status,
)
from tests.client import connect, create_session, say
from tests.client import until as until_frame
from tests.integration.agents import OPERATOR
from tests.integration.cluster import Cluster, cluster_env, reset_shared_queues
from tests.loopback import Loopback

AUTH_TOKEN = "twilio-auth-token-for-tests"
EDGE_SECRET = "phone-tests-edge-secret"
TELNYX_KEY = Ed25519PrivateKey.generate()
TELNYX_PUBLIC = base64.b64encode(
    TELNYX_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()
T = 30.0
STREAM_WAIT_S = 6.0  # BARGEIN_PHONE_STREAM_WAIT_S here: a call whose stream never starts ends then
GRACE_S = 3.0  # BARGEIN_RECONNECT_GRACE_S here: a web caller gone this long without `end` ends it
CALLERS_WORDS = {"hello", "would", "like", "book", "table"}  # one_utterance.wav's first 3 s


@pytest.fixture(scope="module")
def carrier_api() -> Iterator[str]:
    """The carriers' REST APIs, where the edge sends transfers."""
    with Loopback(CarrierApi) as server:
        yield server.url.removesuffix("/v1")


@pytest.fixture(scope="module")
def phone_cluster(
    rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory, carrier_api: str
) -> Iterator[tuple[Cluster, str]]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_REPORT_INTERVAL_MS="20",
        BARGEIN_EDGE_SECRET=EDGE_SECRET,
        BARGEIN_TWILIO_AUTH_TOKEN=AUTH_TOKEN,
        BARGEIN_TWILIO_ACCOUNT_SID="AC123",
        BARGEIN_TWILIO_API_URL=carrier_api,
        BARGEIN_TELNYX_PUBLIC_KEY=TELNYX_PUBLIC,
        BARGEIN_PHONE_STREAM_WAIT_S=str(STREAM_WAIT_S),
        BARGEIN_RECONNECT_GRACE_S=str(GRACE_S),
        BARGEIN_PHONE_AGENT_OPTIONS=json.dumps(
            {"agent": "tests.integration.agents:probe", "say": ALPHABET, "word_delay": 0.005}
        ),
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("phone"))) as cluster:
        cluster.start()
        cluster.start("services.speech")
        yield cluster, cluster.start_edge()


@pytest.fixture(scope="module")
def stack(phone_cluster: tuple[Cluster, str]) -> str:
    return phone_cluster[1]


class Listener:
    """The session's text, as a listener sees it (the test's window on what the agent says)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def text(self) -> str:
        return "".join(f["text"] for f in self.frames if f["type"] == "agent_chunk")

    async def wait(self, what: str, timeout: float = T) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.text().lower():
            assert time.monotonic() < deadline, f"{what!r} never said; said {self.text()!r}"
            await asyncio.sleep(0.05)

    async def echoes_the_caller(self, timeout: float = T) -> None:
        """The caller's words reached the agent (the probe says them back). Two of the clip's
        words are enough: Whisper tiny on 8 kHz phone audio, on a busy machine, has heard "Hello,
        I would like to book a table" as "Hello. I'm Mike. Tamukah. Table 42."."""
        deadline = time.monotonic() + timeout
        while len(CALLERS_WORDS & set(re.findall(r"[a-z]+", self.text().lower()))) < 2:
            assert time.monotonic() < deadline, f"the caller's words never came back; said {self.text()!r}"
            await asyncio.sleep(0.05)


async def _listen(base: str, session_id: str, listener: Listener) -> None:
    token = Tokens(EDGE_SECRET, 3600).issue(session_id, "listener")
    url = base.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws?token={token}&role=listener"
    async with websockets.connect(url) as ws:
        async for raw in ws:
            if isinstance(raw, str):
                listener.frames.append(json.loads(raw))


class listening:
    def __init__(self, base: str, session_id: str) -> None:
        self.base, self.session_id, self.listener = base, session_id, Listener()

    async def __aenter__(self) -> Listener:
        self.task = asyncio.create_task(_listen(self.base, self.session_id, self.listener))
        return self.listener

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()


async def alive(redis_url: str, session_id: str) -> bool:
    store = RedisStateStore.from_url(redis_url)
    try:
        return all([await store.session_info(tier, session_id) for tier in (TIER_REASONING, TIER_SPEECH)])
    finally:
        await store.close()


async def ended_everywhere(redis_url: str, session_id: str, timeout: float = T) -> None:
    store = RedisStateStore.from_url(redis_url)
    try:
        deadline = time.monotonic() + timeout
        while any([await store.session_info(tier, session_id) for tier in (TIER_REASONING, TIER_SPEECH)]):
            assert time.monotonic() < deadline, f"the session lives on after {timeout:g} s"
            await asyncio.sleep(0.1)
    finally:
        await store.close()


def loud(ulaw: bytes) -> bool:
    return len(ulaw) > 0 and float(np.sqrt(np.mean(from_line(ulaw).astype(np.float64) ** 2))) > 300


async def until(condition: Any, timeout: float = T, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


# --- refusals --------------------------------------------------------------------------------------


async def test_a_forged_unsigned_or_tampered_webhook_is_refused(stack: str) -> None:
    assert (await ring(stack, AUTH_TOKEN, signature="bm90IGEgc2lnbmF0dXJl")).status == 403
    assert (await ring(stack, AUTH_TOKEN, signature="")).status == 403
    assert (await ring(stack, "another-accounts-token")).status == 403
    good = await ring(stack, AUTH_TOKEN)
    assert good.status == 200, good.body
    assert good.stream_url.startswith("ws://") and good.stream_url.endswith("/v1/twilio/media")
    assert set(good.parameters) == {"session", "token"}


async def test_a_refused_signature_names_the_url_it_was_checked_against_and_the_setting(
    phone_cluster: tuple[Cluster, str],
) -> None:
    """Behind a TLS proxy every webhook fails its signature when BARGEIN_PUBLIC_URL is unset: the
    operator reads which URL was checked, and which setting to set, in the edge's log."""
    cluster, stack = phone_cluster
    edge = next(p for p in cluster.processes if p.name.startswith("broadcast"))
    assert "BARGEIN_PUBLIC_URL is not" in edge.log()  # said at start-up: a carrier and no public URL
    refused = await ring(stack, "another-accounts-token")
    assert refused.status == 403 and "checked against" not in refused.body  # the requester learns less
    async with asyncio.timeout(10):
        while "refused: " not in edge.log():  # noqa: ASYNC110 - a log file
            await asyncio.sleep(0.05)
    line = next(line for line in edge.log().splitlines() if "webhook refused: " in line)
    assert f"{stack}/v1/twilio/voice" in line and "set BARGEIN_PUBLIC_URL" in line, line


async def test_a_stream_with_a_forged_token_or_an_unknown_session_is_refused(stack: str) -> None:
    answer = await ring(stack, AUTH_TOKEN)
    for parameters, code in (({"token": "forged"}, 4401), ({"session": "f" * 32}, 4404)):
        async with streamed(answer, **parameters) as stream:
            await asyncio.wait_for(stream.ws.wait_closed(), 10)
            assert stream.ws.close_code == code


async def test_telnyx_refuses_a_forged_or_replayed_webhook(stack: str) -> None:
    assert (await ring_telnyx(stack, Ed25519PrivateKey.generate())).status == 403  # another key
    assert (await ring_telnyx(stack, TELNYX_KEY, at=time.time() - 3600)).status == 403  # replayed
    assert (await ring_telnyx(stack, TELNYX_KEY)).status == 200


# --- calls -----------------------------------------------------------------------------------------


async def test_a_phone_call_is_answered_aloud_and_a_barge_in_clears_the_line_and_cuts_the_history(
    stack: str, redis_url: str
) -> None:
    answer = await ring(stack, AUTH_TOKEN)
    session_id = answer.parameters["session"]
    async with listening(stack, session_id) as listener, streamed(answer) as call:
        await call.speak(speech_of("one_utterance.wav")[: 16000 * 2 * 3], then_silence_s=1.2)
        await listener.echoes_the_caller()
        await until(lambda: loud(bytes(call.played)), what="the answer is never heard")
        await asyncio.sleep(1.5)  # the agent is mid-answer: it has 40 words to say
        marks_before = len(call.marks())
        await call.speak(speech_of("barge_in.wav")[int(5.7 * 32000) :], then_silence_s=1.0)
        await until(lambda: call.marks("clear"), what="a barge-in never cleared the line")
        cleared_at = call.marks("clear")[0].at
        cut_turn = int(call.marks()[marks_before - 1].name.split(".")[0])
        await asyncio.sleep(1.0)
        later = [m for m in call.marks() if m.at > cleared_at]
        assert all(int(m.name.split(".")[0]) > cut_turn for m in later), later  # nothing more of it
        heard_marks = [n for n in call.acked if int(n.split(".")[0]) == cut_turn]
        full = "".join(
            f["text"] for f in listener.frames if f["type"] == "agent_chunk" and f["turn"] == cut_turn
        )
        deadline = time.monotonic() + T
        while len(said := (await history(redis_url, session_id))[0].split()) >= len(full.split()):
            assert time.monotonic() < deadline, "the history was never cut"
            await asyncio.sleep(0.2)
        await call.hang_up()
        await ended_everywhere(redis_url, session_id)
    assert 0 < len(said) < len(full.split()), (said, full)  # cut, not whole
    assert full.split()[: len(said)] == said  # what was said up to the cut, word for word
    # the history keeps what the carrier said was played: never a word whose mark was dropped
    assert len(said) <= len(heard_marks), (said, heard_marks)


async def test_key_presses_reach_the_agent(stack: str) -> None:
    answer = await ring(stack, AUTH_TOKEN, query="?agent=tests.integration.agents:keypad")
    assert answer.status == 200, answer.body
    async with listening(stack, answer.parameters["session"]) as listener, streamed(answer) as call:
        await asyncio.sleep(0.5)
        await call.press("1")
        await call.press("2")
        await listener.wait("you pressed 12")
        await until(lambda: loud(bytes(call.played)), what="the answer to the keys is never heard")


@pytest.mark.parametrize("encoding", ["PCMU", "PCMA", "G722"])
async def test_a_telnyx_call_is_heard_and_answered_and_its_hang_up_ends_it(
    stack: str, redis_url: str, encoding: str
) -> None:
    # PCMA: a European call Telnyx could not transcode to the μ-law the markup asks for; G722: an
    # HD-voice call, likewise
    answer = await ring_telnyx(stack, TELNYX_KEY)
    assert "?" not in answer.stream_url, "the caller token must not ride in the stream URL"
    session_id = answer.parameters["session"]
    streaming = streamed(answer, TelnyxStream, encoding=encoding)
    async with listening(stack, session_id) as listener, streaming as call:
        await call.speak(speech_of("one_utterance.wav")[: 16000 * 2 * 3], then_silence_s=1.2)
        await listener.echoes_the_caller()
        await until(lambda: loud(bytes(call.played)), what="the answer is never heard")
        await until(lambda: call.acked, what="no mark was ever echoed")
        await call.hang_up()
        await ended_everywhere(redis_url, session_id)


async def test_the_agents_transfer_moves_the_phone_call_to_the_number_and_ends_the_session(
    stack: str, redis_url: str
) -> None:
    CarrierApi.requests.clear()
    answer = await ring(stack, AUTH_TOKEN, query="?agent=tests.integration.agents:operator")
    async with streamed(answer) as call:
        await asyncio.sleep(0.5)
        await call.press("0")
        await asyncio.wait_for(call.ws.wait_closed(), T)  # the stream ends: the call is elsewhere
    (update,) = [r for r in CarrierApi.requests if call.call_sid in r["path"]]
    assert update["path"] == f"/2010-04-01/Accounts/AC123/Calls/{call.call_sid}.json"
    assert f"<Dial>{OPERATOR}</Dial>" in parse_qs(update["body"])["Twiml"][0]
    await ended_everywhere(redis_url, answer.parameters["session"])


async def answered_call(stack: str, cough: bytes | None) -> MediaStream:
    """A call whose agent says nine words of its own after the caller's first words, with
    ``cough`` said a second into its voice; the carrier's record once all of it has played."""
    words = "alpha+bravo+charlie+delta+echo+foxtrot+golf+hotel+india"
    answer = await ring(stack, AUTH_TOKEN, query=f"?echo=no&say={words}&word_delay=0.005")
    async with streamed(answer) as call:
        await call.speak(speech_of("one_utterance.wav")[: 16000 * 2 * 3], then_silence_s=1.2)
        await until(lambda: loud(bytes(call.played)), what="the answer is never heard")
        await asyncio.sleep(1.0)
        if cough is not None:
            await call.speak(cough, then_silence_s=1.0)
        await until(lambda: call.idle_for() > 2.0, what="the answer never ended")
    return call


async def test_a_cough_on_the_line_pauses_the_voice_with_a_clear_and_nothing_is_lost_or_repeated(
    stack: str,
) -> None:
    control = await answered_call(stack, None)
    cough = speech_of("short_burst.wav")[: int(0.2 * 16000) * 2]  # 200 ms of a "Hmm."
    call = await answered_call(stack, cough)
    assert call.marks("clear"), "the cough did not pause the agent (a carrier's pause is a clear)"
    assert not control.marks("clear")
    # the turn went on after the pause: its marks keep coming, and every word was heard once
    assert list(dict.fromkeys(call.acked)) == list(dict.fromkeys(control.acked))
    # as much audio played as without the cough (a frame is 160 bytes; eSpeak NG varies a little).
    # Nothing repeated beyond that. What is lost is at most the carrier's lag behind the edge's
    # clock at the pause (the rewind goes back to what the clock says was played; the clear drops
    # what the carrier had not yet played of it): 60 ms was seen with the machine busy.
    ours, theirs = len(call.played.rstrip(b"\xff")), len(control.played.rstrip(b"\xff"))
    assert ours - theirs < 480, (ours, theirs)
    assert theirs - ours < 960, (ours, theirs)


# --- sessions end when the call does ----------------------------------------------------------------


async def test_a_call_that_hangs_up_before_its_stream_starts_ends_when_twilio_says_so(
    stack: str, redis_url: str
) -> None:
    answer = await ring(stack, AUTH_TOKEN)
    session_id, status_url = answer.parameters["session"], answer.attributes["statusCallback"]
    assert status_url == f"{stack}/v1/twilio/status"
    call = {"CallSid": answer.call_sid}
    assert await twilio_status(status_url, AUTH_TOKEN, forged=True, **call, CallStatus="canceled") == 403
    assert await twilio_status(status_url, AUTH_TOKEN, **call, CallStatus="in-progress") == 204
    assert await twilio_status(status_url, AUTH_TOKEN, **call, StreamEvent="stream-started") == 204
    assert await alive(redis_url, session_id), "a forged or a going-on status ended the call"
    assert await twilio_status(status_url, AUTH_TOKEN, **call, CallStatus="canceled") == 204
    # well before the stream wait would have ended it
    await ended_everywhere(redis_url, session_id, timeout=STREAM_WAIT_S - 2)
    other = {"CallSid": "CA-not-ours"}  # a call no session answers: nothing to end, no error
    assert await twilio_status(status_url, AUTH_TOKEN, **other, CallStatus="completed") == 204


async def test_a_call_whose_stream_never_starts_ends_after_the_stream_wait(
    stack: str, redis_url: str
) -> None:
    asked = time.monotonic()
    answer = await ring(stack, AUTH_TOKEN)  # and then no stream (its URL was wrong, say)
    session_id = answer.parameters["session"]
    await asyncio.sleep(STREAM_WAIT_S / 2)
    assert await alive(redis_url, session_id)
    await ended_everywhere(redis_url, session_id, timeout=STREAM_WAIT_S + T)
    assert time.monotonic() - asked >= STREAM_WAIT_S - 0.5


async def test_a_telnyx_hang_up_event_ends_the_call_and_closes_its_stream(stack: str, redis_url: str) -> None:
    answer = await ring_telnyx(stack, TELNYX_KEY)
    session_id = answer.parameters["session"]
    status_url = answer.attributes["statusCallback"]
    async with streamed(answer, TelnyxStream) as call:
        await asyncio.sleep(0.5)
        hangup = {"call_control_id": answer.call_sid, "hangup_cause": "normal_clearing"}
        assert await telnyx_event(status_url, Ed25519PrivateKey.generate(), "call.hangup", **hangup) == 403
        assert await telnyx_event(status_url, TELNYX_KEY, "call.answered", **hangup) == 204
        assert await alive(redis_url, session_id)
        assert await telnyx_event(status_url, TELNYX_KEY, "call.hangup", **hangup) == 204
        await ended_everywhere(redis_url, session_id)
        await asyncio.wait_for(call.ws.wait_closed(), T)


async def test_a_web_caller_who_leaves_without_end_may_come_back_within_the_grace_and_then_it_ends(
    stack: str, redis_url: str
) -> None:
    session = await create_session(stack, agent_options={"agent": "tests.integration.agents:probe"})
    session_id = session["session_id"]
    async with connect(session) as ws:
        await say(ws, "hello")
        await until_frame(ws, "turn_complete")
    # the connection dropped (a tunnel, a reload): no `end`
    await asyncio.sleep(GRACE_S * 0.6)
    async with connect(session) as ws:  # back in time: the same session, going on
        await say(ws, "again")
        await until_frame(ws, "turn_complete")
    left = time.monotonic()
    await asyncio.sleep(GRACE_S * 0.6)  # the grace counts from the last time the caller left
    assert await alive(redis_url, session_id)
    async with connect(session, role="listener", token=session["listener_token"]):
        await ended_everywhere(redis_url, session_id, timeout=GRACE_S + T)  # a listener is no caller
    assert time.monotonic() - left >= GRACE_S - 0.5
    async with connect(session) as ws:  # too late: the session is over
        frames = []
        with contextlib.suppress(websockets.ConnectionClosed):
            await until_frame(ws, "error", frames)
        assert [f.get("code") for f in frames if f["type"] == "error"] == ["unknown_session"], frames
