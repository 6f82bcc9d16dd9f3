"""``transcript-chunk`` events from an engine's results (:class:`talkies.wyoming.asr.Chunks`):
append-only, sent as soon as text is stable, joined exactly into the transcript."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial
from talkies.wyoming.asr import Chunks


def chunks_of(results: list[Any]) -> tuple[list[tuple[int, str]], str]:
    """(index of the result that sent it, chunk) for each chunk, and the transcript."""
    chunks = Chunks()
    sent = []
    for k, result in enumerate(results):
        partial = isinstance(result, EnginePartial)
        piece = chunks.partial(result) if partial else chunks.end(result)
        if piece:
            sent.append((k, piece))
    return sent, chunks.text


def test_stable_text_is_sent_while_the_utterance_goes_on() -> None:
    results = [
        EnginePartial(text="and mister", stable=0),
        EnginePartial(text="And Mr. John", stable=3),
        EnginePartial(text="And Mr. John dash", stable=12),
        EnginePartial(text="And Mr. John Dashwood had", stable=12),  # nothing new
        EngineEndpoint(text="And Mr. John Dashwood had then."),
        EnginePartial(text="He was", stable=None),  # no promise: nothing before the end
        EngineEndpoint(text=""),  # withdrawn (a click)
        EnginePartial(text="He was not", stable=7),  # "He was " -> "He was" (no trailing space)
        EngineFinal(text="He was not an ill-disposed young man."),
    ]
    sent, transcript = chunks_of(results)
    assert sent == [
        (1, "And"),
        (2, " Mr. John"),
        (4, " Dashwood had then."),
        (7, " He was"),
        (8, " not an ill-disposed young man."),
    ]
    assert "".join(p for _, p in sent) == transcript
    assert transcript == "And Mr. John Dashwood had then. He was not an ill-disposed young man."


def test_without_stable_text_each_utterance_is_one_chunk() -> None:
    sent, transcript = chunks_of(
        [
            EnginePartial(text="go"),
            EngineEndpoint(text=" go forward "),
            EngineEndpoint(text="  "),
            EngineFinal(text="ten meters"),
        ]
    )
    assert [p for _, p in sent] == ["go forward", " ten meters"]
    assert transcript == "go forward ten meters"


def test_a_broken_promise_still_joins_into_the_transcript() -> None:
    sent, transcript = chunks_of(
        [EnginePartial(text="Howdy married", stable=5), EngineFinal(text="Had he married")]
    )
    assert "".join(p for _, p in sent) == transcript == "Howdy Had he married"


@settings(max_examples=200, deadline=None)
@given(
    utterances=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "bc", "d.", "e,", "f-g"]), max_size=6),
            st.lists(st.integers(0, 40), max_size=6),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_chunks_always_join_into_the_transcript(
    utterances: list[tuple[list[str], list[int]]],
) -> None:
    """Partials with growing stable prefixes of each utterance's text, then its end."""
    results: list[Any] = []
    for k, (words, stables) in enumerate(utterances):
        text = " ".join(words)
        for stable in sorted(min(s, len(text)) for s in stables):
            results.append(EnginePartial(text=text + " more", stable=stable))
        last = k == len(utterances) - 1
        results.append(EngineFinal(text=text) if last else EngineEndpoint(text=text))
    sent, transcript = chunks_of(results)
    assert "".join(p for _, p in sent) == transcript
    assert transcript == " ".join(" ".join(w) for w, _ in utterances if w)
