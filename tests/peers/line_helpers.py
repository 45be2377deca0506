"""The events Line's own tests import from a ``helpers`` module that its source distribution does
not ship. Ours, written from how the tests use them: plain pydantic models, as Line's events were
(bargein must route them as Line did)."""

from __future__ import annotations

from pydantic import BaseModel


class DummyEvent(BaseModel):
    data: str = ""


class SubDummyEvent(DummyEvent):
    pass


class AnotherEvent(BaseModel):
    data: str = ""


class NumberEvent(BaseModel):
    value: int
