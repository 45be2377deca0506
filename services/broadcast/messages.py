"""What clients may send as JSON, validated (docs/protocol.md, "Client → server")."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextTurn(_Msg):
    type: Literal["text"]
    text: str = Field(min_length=1, max_length=10_000)


class Played(_Msg):
    type: Literal["played"]
    turn: int = Field(ge=0)
    seq: int = Field(ge=0)


class Interrupt(_Msg):
    type: Literal["interrupt"]


class End(_Msg):
    type: Literal["end"]


ClientMessage = Annotated[TextTurn | Played | Interrupt | End, Field(discriminator="type")]
_ADAPTER: TypeAdapter[TextTurn | Played | Interrupt | End] = TypeAdapter(ClientMessage)


class ClientMessageError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse(text: str) -> TextTurn | Played | Interrupt | End:
    try:
        data = json.loads(text)
    except ValueError:
        raise ClientMessageError("malformed_json", "text frames must be JSON objects") from None
    if not isinstance(data, dict):
        raise ClientMessageError("malformed_json", "text frames must be JSON objects")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ClientMessageError(
            "unknown_type", f"not a valid message ({where}: {first['msg']}); see docs/protocol.md"
        ) from None
