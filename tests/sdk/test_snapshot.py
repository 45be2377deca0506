"""Checkpoints of the state agents keep in objects of their own (Line's examples do: a form
manager, an ``Enum`` state, a pydantic context), rebuilt by a new owner from the attributes its
freshly built node has, never by importing a class named in the checkpoint."""

from __future__ import annotations

import enum
import logging

import pytest
from pydantic import BaseModel

from bargein import AgentResponse
from bargein.runtime import snapshot


class Stage(enum.Enum):
    WELCOME = "welcome"
    VERIFIED = "verified"


class Details(BaseModel):  # a plain pydantic model that is no event
    name: str = ""
    verified: bool = False


class Form:
    def __init__(self) -> None:
        self.index = 0
        self.answers: dict[str, str] = {}
        self.details = Details()
        self.on_done = print  # a callable: rebuilt by the agent, not checkpointed


class Agent:
    def __init__(self) -> None:
        self.stage = Stage.WELCOME
        self.form = Form()
        self.history = [AgentResponse(content="hi")]
        self.client = logging.getLogger("agent")  # a library object: not the agent's state


def roundtrip(before: Agent) -> Agent:
    data = snapshot.dumps({"nodes": {"n": snapshot.capture(before)}})
    after = Agent()  # the new owner builds the agent again...
    snapshot.restore(after, snapshot.loads(data)["nodes"]["n"])  # ...and restores its state
    return after


def test_enums_models_and_the_agents_own_objects_survive_a_handover() -> None:
    before = Agent()
    before.stage = Stage.VERIFIED
    before.form.index = 2
    before.form.answers = {"name": "Ada"}
    before.form.details = Details(name="Ada", verified=True)
    after = roundtrip(before)
    assert after.stage is Stage.VERIFIED
    assert (after.form.index, after.form.answers) == (2, {"name": "Ada"})
    assert after.form.details == Details(name="Ada", verified=True)
    assert after.form.on_done is print and after.history == [AgentResponse(content="hi")]


def test_a_value_that_no_longer_fits_the_fresh_attribute_is_left_as_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = Agent()
    before.stage = Stage.VERIFIED
    data = snapshot.dumps({"n": snapshot.capture(before)})
    after = Agent()
    after.stage = None  # type: ignore[assignment]  # this version of the agent builds no Stage there
    with caplog.at_level(logging.WARNING):
        snapshot.restore(after, snapshot.loads(data)["n"])
    assert after.stage is None
    assert "cannot restore Agent.stage" in caplog.text


def test_library_objects_and_cycles_are_not_walked() -> None:
    class Node:
        def __init__(self) -> None:
            self.peer: Node | None = None
            self.count = 1

    a, b = Node(), Node()
    a.peer, b.peer = b, a  # a cycle: captured to a bounded depth, never forever
    state = snapshot.capture(a)
    assert state["count"] == 1 and "peer" in state
    assert "client" not in snapshot.capture(Agent())  # a Logger: the standard library's


def test_an_event_changed_in_place_is_checkpointed_as_it_is_now() -> None:
    # checkpoints reuse what they packed of an event before: only while it is the same object
    # holding the same values
    history = [AgentResponse(content="one"), AgentResponse(content="two")]
    first = snapshot.loads(snapshot.dumps({"history": history}))["history"]
    assert snapshot.loads(snapshot.dumps({"history": history}))["history"] == first
    history[1].content = "three"  # changed in place, as an agent may
    again = snapshot.loads(snapshot.dumps({"history": history}))["history"]
    assert again == [AgentResponse(content="one"), AgentResponse(content="three")]
    history[0] = AgentResponse(content="one")  # an equal event, a new object
    assert snapshot.loads(snapshot.dumps({"history": history}))["history"] == again


def test_what_checkpoints_keep_of_packed_events_is_bounded() -> None:
    events = [AgentResponse(content=f"e{i}") for i in range(snapshot.PACKED_EVENTS_KEPT + 100)]
    restored = snapshot.loads(snapshot.dumps({"history": events}))["history"]
    assert restored == events
    assert len(snapshot._PACKED_EVENTS) <= snapshot.PACKED_EVENTS_KEPT
