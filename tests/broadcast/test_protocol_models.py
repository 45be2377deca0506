"""docs/protocol.md and the protocol's models (bargein.edge.protocol) describe the same protocol."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from bargein.edge.protocol import (
    ClientMessage,
    ErrorCode,
    ProtocolError,
    ServerFrame,
    SessionRequest,
    frame_json,
    parse,
    parse_server_frame,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def _section(title: str) -> str:
    return DOC.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _types(union: object) -> dict[str, type]:
    members = typing.get_args(typing.get_args(union)[0])
    return {m.model_fields["type"].annotation.__args__[0]: m for m in members}  # type: ignore[attr-defined]


def _documented_types(title: str) -> set[str]:
    return set(re.findall(r'^\| `\{"type": "(\w+)"', _section(title), re.M))


def test_every_frame_the_edge_sends_is_documented_and_every_documented_one_has_a_model() -> None:
    assert set(_types(ServerFrame)) == _documented_types("Server → client")


def test_every_message_a_client_sends_is_documented_and_has_a_model() -> None:
    assert set(_types(ClientMessage)) == _documented_types("Client → server")


def test_every_error_code_is_in_the_documents_table() -> None:
    codes = {value for name, value in vars(ErrorCode).items() if name.isupper() and isinstance(value, str)}
    documented = set(re.findall(r"^\| `(\w+)` \|", _section("Error codes"), re.M))
    assert codes == documented


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "agent_chunk", "turn": 1, "seq": 0, "text": "hi"},
        {"type": "clear", "turn": 3},
        {"type": "turn_complete", "turn": 1},
        {"type": "user_started_speaking"},
        {"type": "user_stopped_speaking"},
        {"type": "user_stopped_speaking", "false_interruption": True},
        {"type": "error", "code": "slow_client", "message": "too far behind"},
        {"type": "ended", "reason": "caller"},
    ],
)
def test_server_frames_read_back_as_they_were_sent(frame: dict[str, object]) -> None:
    assert frame_json(parse_server_frame(json.dumps(frame))) == frame


def test_what_is_not_the_protocol_is_refused_with_the_clients_code() -> None:
    with pytest.raises(ProtocolError) as bad_json:
        parse("{nope")
    assert bad_json.value.code == ErrorCode.MALFORMED_JSON
    with pytest.raises(ProtocolError) as unknown:
        parse(json.dumps({"type": "dance"}))
    assert unknown.value.code == ErrorCode.UNKNOWN_TYPE
    with pytest.raises(ProtocolError) as server:
        parse_server_frame(json.dumps({"type": "agent_chunk", "turn": "one"}))
    assert server.value.code == ErrorCode.UNKNOWN_TYPE


def test_a_session_request_is_checked_with_the_speech_settings_bounds() -> None:
    assert SessionRequest.parse(b"").turn_taking == {}
    assert SessionRequest.parse(b'{"turn_taking": {"threshold": 0.6}}').turn_taking == {"threshold": 0.6}
    bad = [
        b'{"turn_taking": {"min_silence_ms": 5}}',
        b'{"turn_taking": {"vad_tick_ms": 4}}',
        b'{"turn_taking": {"min_silence_ms": NaN}}',
        b'{"turn_taking": {"min_silence_ms": Infinity}}',
        b'{"turn_taking": {"min_silence_ms": true}}',
        b'{"turn_taking": {"min_silence_ms": "600"}}',
        b"[1]",
    ]
    for body in bad:
        with pytest.raises(ProtocolError) as refused:
            SessionRequest.parse(body)
        assert refused.value.code == "bad_request"
