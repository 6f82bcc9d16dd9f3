"""Every (state, input kind) pair of the transition table, walked with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.protocol import TABLE, Close, Input, Release, Send, State, StreamSession
from talkies.protocol.table import ALLOWED, Handler, InputKind

from .protocol_helpers import LIMITS, error_of, session_in
from .strategies import representative

PAIRS = [(s, k) for s in State for k in InputKind]
CLIENT_KINDS = {
    InputKind.TEXT_PART,
    InputKind.START,
    InputKind.END,
    InputKind.CANCEL,
    InputKind.OTHER_TYPE,
    InputKind.MALFORMED,
    InputKind.AUDIO_PART,
    InputKind.AUDIO,
    InputKind.AUDIO_BATCH,
}
# A translator's input: rejected before streaming as the driver's are (its bug, 4500).


def test_table_is_total() -> None:
    assert set(TABLE) == set(PAIRS)
    assert len(TABLE) == len(State) * len(InputKind)


def test_every_handler_is_used_and_implemented() -> None:
    used = {rule.handler for rule in TABLE.values()}
    assert used == set(Handler)
    s = StreamSession(now=0)
    for handler in Handler:
        assert callable(getattr(s, f"_on_{handler.value}"))


def test_closed_ignores_everything_and_only_closed_does() -> None:
    for (state, _kind), rule in TABLE.items():
        assert (rule.handler is Handler.IGNORE) == (state is State.CLOSED)


def test_rejections_of_client_inputs_are_4400_and_of_driver_inputs_4500() -> None:
    for (state, kind), rule in TABLE.items():
        if rule.handler is not Handler.REJECT:
            continue
        assert rule.code is not None
        assert rule.next == {State.CLOSED}
        expected = 4400 if kind in CLIENT_KINDS else 4500
        assert rule.code.close_code == expected, (state, kind)


def test_accepting_rules_are_listed_explicitly() -> None:
    # The table's explicit part never lists a bare rejection: those are the defaults.
    assert all(rule.handler is not Handler.REJECT for rule in ALLOWED.values())


@pytest.mark.parametrize(("state", "kind"), PAIRS, ids=[f"{s.value}-{k.value}" for s, k in PAIRS])
@settings(max_examples=25, deadline=None)
# Around both timers of a session made at 0 (protocol_helpers.LIMITS): the start deadline
# (5 s, before start) and the idle one (30 s, while streaming).
@given(data=st.data(), later=st.sampled_from([0.0, 4.999, 5.0, 29.999, 30.0, 60.0]))
def test_every_pair_has_its_defined_outcome(
    state: State, kind: InputKind, data: st.DataObject, later: float
) -> None:
    item: Input = data.draw(representative(kind))
    s = session_in(state, now=0.0)
    assert s._classify(item)[0] is kind
    held = s.stream_held
    deadline = s.deadline
    rule = TABLE[state, kind]
    s.handle(item, later)
    actions = s.pull_actions()
    assert s.state in rule.next
    if kind is InputKind.TICK and state is not State.CLOSED:
        # The timer's one input: it closes with idle_timeout exactly when a deadline passed.
        expected = {
            State.AWAITING_START: LIMITS.start_timeout_seconds,
            State.STREAMING: LIMITS.idle_timeout_seconds,
        }.get(state)
        assert deadline == expected
        due = deadline is not None and later >= deadline
        assert error_of(actions) == (("idle_timeout", 4408) if due else None)
        assert (s.state is State.CLOSED) == due
    if rule.handler is Handler.IGNORE:
        assert actions == []
        return
    if rule.handler is Handler.REJECT:
        assert rule.code is not None
        assert error_of(actions) == (rule.code.value, rule.code.close_code)
    closes = [a for a in actions if isinstance(a, Close)]
    releases = [a for a in actions if isinstance(a, Release)]
    if s.state is State.CLOSED:
        assert len(releases) == int(held)
        assert len(closes) <= 1
        if closes:
            assert actions[-1] is closes[0]
    else:
        assert not closes and not releases
        assert all(not isinstance(a, Send) or a.event.type != "error" for a in actions)
