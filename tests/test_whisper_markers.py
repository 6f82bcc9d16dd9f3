"""Whisper's non-speech annotations are neither words nor transcript text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from talkies.engines.whisper.markers import speech_mask, strip_markers


def test_blank_audio_alone_is_no_word() -> None:
    assert speech_mask(["[BLANK_AUDIO]"]) == [False]


def test_annotation_spanning_words_is_dropped_whole() -> None:
    words = ["hello", "[", "Silence", "]", "world", "(wind", "blowing)", "*laughs*"]
    kept = [w for w, k in zip(words, speech_mask(words), strict=True) if k]
    assert kept == ["hello", "world"]


def test_unclosed_bracket_marks_nothing() -> None:
    words = ["(", "and", "then", "*", "more"]
    assert speech_mask(words) == [True] * 5


def test_strip_markers_in_segment_text() -> None:
    assert strip_markers(" [BLANK_AUDIO] He was (music) not *sighs* ill.") == "He was not ill."
    assert strip_markers("[BLANK_AUDIO]") == ""
    assert strip_markers("3 * 4 is twelve") == "3 * 4 is twelve"


_plain = st.text(
    alphabet=st.characters(
        blacklist_characters="[]()*", blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")
    ),
    min_size=1,
)


@given(st.lists(_plain, max_size=20))
def test_words_without_brackets_are_all_kept(words: list[str]) -> None:
    assert speech_mask(words) == [True] * len(words)
    assert strip_markers(" ".join(words)) == " ".join(words)
