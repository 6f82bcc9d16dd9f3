"""The Realtime translator's JSON fast path (``_parse``) is ``json.loads``: the same value or
the same error class, for any text and for JSON objects with anything around them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from talkies.dialects.realtime import _parse

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _outcome(text: str) -> tuple[str, Any]:
    try:
        return "value", repr(json.loads(text))
    except (ValueError, RecursionError) as error:
        return "error", type(error)


def _parsed(text: str) -> tuple[str, Any]:
    try:
        return "value", repr(_parse(text))
    except (ValueError, RecursionError) as error:
        return "error", type(error)


@given(st.text(max_size=40))
def test_any_text(text: str) -> None:
    assert _parsed(text) == _outcome(text)


@given(
    st.dictionaries(st.text(max_size=6), _JSON, max_size=4),
    st.sampled_from(["", " ", "\n", "{}", "}", "x", " {", ","]),
    st.sampled_from(["", " ", "\t"]),
    st.integers(min_value=0, max_value=60),
)
def test_objects_with_anything_around(
    value: dict[str, Any], after: str, before: str, cut: int
) -> None:
    text = before + json.dumps(value) + after
    for candidate in (text, text[:cut], text[cut:]):
        assert _parsed(candidate) == _outcome(candidate)


def test_an_append_reads_as_json_loads_reads_it() -> None:
    text = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e"})
    assert _parse(text) == json.loads(text)
