"""The Deepgram translator (talkies/dialects/deepgram.py): pure, and property-tested.

Hypothesis drives the translator and the real native session together (fuzz/_listen.py) with
arbitrary queries, client messages in any fragmentation, and engine results with Finalize
anywhere; every message out must have Deepgram's shape (fuzz._listen.check_message, and the
deepgram SDK's own pydantic models), and no word may be sent final twice or be lost.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fuzz._listen import ListenPair, check_message
from talkies.dialects import ListenError, ListenOptions, ListenTranslator, parse_listen_query
from talkies.protocol import (
    AudioBatch,
    BinaryReceived,
    EngineEndpoint,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    TextReceived,
    Word,
)

ROOT = Path(__file__).resolve().parent.parent
DIALECTS = ROOT / "talkies" / "dialects"
OPTIONS = ListenOptions(model="tiny-test", interim_results=True, vad_events=True)

# -- purity: the same rules as talkies/protocol (tests/test_protocol_purity.py) -------------

ALLOWED = {"__future__", "collections", "collections.abc", "dataclasses", "enum", "json", "math"}
# hashlib: Metadata's sha256 of the audio (computation, no I/O).
ALLOWED |= {"re", "types", "typing", "urllib.parse", "hashlib"}
# base64, binascii: the Realtime dialect's audio arrives base64-encoded in JSON.
ALLOWED |= {"base64", "binascii"}
FORBIDDEN_NAMES = {"print", "open", "input", "exec", "eval", "__import__", "breakpoint"}


def test_dialects_import_only_pure_modules() -> None:
    for path in sorted(DIALECTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1 or node.module == "protocol", path.name
                    continue
                names = [node.module or ""]
            elif isinstance(node, ast.Name):
                assert node.id not in FORBIDDEN_NAMES, f"{path.name}:{node.lineno} {node.id}"
                continue
            else:
                continue
            for name in names:
                assert name in ALLOWED, f"{path.name} imports {name}"


def test_importing_the_dialects_pulls_in_no_io_modules() -> None:
    code = (
        "import sys; before = set(sys.modules); import talkies.dialects; "
        "new = set(sys.modules) - before; "
        "bad = {m for m in new if m.split('.')[0] in "
        "{'socket','threading','asyncio','logging','time','random','os','anyio','selectors',"
        "'uuid','datetime'}}; print(sorted(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- the query --------------------------------------------------------------------------------

_KEYS = ["model", "language", "encoding", "sample_rate", "channels", "interim_results"]
_KEYS += ["endpointing", "utterance_end_ms", "vad_events", "punctuate", "smart_format", "tag"]
_KEYS += ["diarize", "keywords", "token", "filler_words", "mip_opt_out", "multichannel"]
_VALUES = ["true", "false", "16000", "8000", "1", "2", "linear16", "opus", "tiny-test", "en"]
_VALUES += ["1000", "500", "", "nova-3", "multi", "%FF", "a b", "-1", "99999999999"]

queries = st.one_of(
    st.text(max_size=300),
    st.lists(st.tuples(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), max_size=12).map(
        lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)
    ),
)


@given(queries)
def test_a_query_is_options_or_a_listen_error(query: str) -> None:
    try:
        options = parse_listen_query(query, default_model="tiny-test")
    except ListenError as exc:
        assert exc.code in ErrorCode and exc.detail
        return
    assert options.model and json.loads(options.start_message())["type"] == "start"


def test_a_query_with_everything_livekit_sends_is_accepted() -> None:
    query = (
        "model=whisper-base-en&punctuate=true&smart_format=false&no_delay=true&"
        "interim_results=true&encoding=linear16&vad_events=true&sample_rate=16000&channels=1&"
        "endpointing=25&filler_words=true&profanity_filter=false&numerals=false&"
        "mip_opt_out=false&language=en-US&utterance_end_ms=1000"
    )
    options = parse_listen_query(query, default_model="x")
    assert options == ListenOptions(
        model="whisper-base-en",
        language="en-US",
        interim_results=True,
        endpointing=True,
        utterance_end_ms=1000,
        vad_events=True,
        punctuate=True,
    )


# -- client messages in any fragmentation -----------------------------------------------------

_CONTROL = [
    '{"type":"KeepAlive"}',
    '{"type":"Finalize"}',
    '{"type":"CloseStream"}',
    '{"type":"Configure"}',
    '{"type":"end"}',
    "[1,2]",
    "{",
    '{"type":7}',
    "x" * 5000,
]


@st.composite
def fragmented(draw: st.DrawFn, text: str) -> list[TextReceived]:
    data = text.encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return [TextReceived(data=piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_message_in_fragments_acts_as_it_does_whole(data: st.DataObject) -> None:
    texts = data.draw(st.lists(st.sampled_from(_CONTROL), min_size=1, max_size=4))
    whole, split = ListenPair(OPTIONS), ListenPair(OPTIONS)
    for pair in (whole, split):
        pair.engine(EngineOpened())
        pair.client([AudioBatch(frames=(b"\x01\x00" * 800,))])
    for text in texts:
        whole.client([TextReceived(data=text)])
        for piece in data.draw(fragmented(text)):
            split.client([piece])
    for pair in (whole, split):
        pair.engine(EnginePartial(text="a", words=(Word(word="a", start=0.0, end=0.01),)))
        pair.finish()
    assert whole.messages == split.messages
    assert whole.close_code == split.close_code


# -- Finalize: no word twice, none lost -------------------------------------------------------


@st.composite
def utterances(draw: st.DrawFn) -> list[Word]:
    count = draw(st.integers(1, 12))
    words, t = [], 0.0
    for i in range(count):
        t += draw(st.floats(0.0, 0.5))
        length = draw(st.floats(0.01, 0.6))
        words.append(Word(word=f"w{i}", start=round(t, 3), end=round(t + length, 3)))
        t += length
    return words


@settings(max_examples=150, deadline=None)
@given(utterances(), st.data(), st.booleans())
def test_finalize_anywhere_sends_every_word_final_exactly_once(
    words: list[Word], data: st.DataObject, timed: bool
) -> None:
    """Partials grow word by word; a Finalize after any of them is a cut, which the engine
    answers (as the runtime does) with the words since the last cut, and starts afresh; an
    endpoint or CloseStream's final ends the rest: the final words, in order, are exactly the
    utterance's, and each Finalize has its one ``from_finalize`` answer."""
    pair = ListenPair(OPTIONS)
    pair.engine(EngineOpened())
    finalize_after = data.draw(st.sets(st.integers(0, len(words))))
    ending = data.draw(st.sampled_from(["endpoint", "final"]))
    since = 0  # where the engine's current utterance began (the last cut)

    def shown(n: int) -> tuple[str, tuple[Word, ...]]:
        part = tuple(words[since:n])
        return " ".join(w.word for w in part), part if timed else ()

    for n in range(len(words) + 1):
        if n > since:
            text, shown_words = shown(n)
            pair.client([AudioBatch(frames=(b"\x00\x00" * 320,))])
            pair.engine(EnginePartial(text=text, words=shown_words))
        if n in finalize_after:
            pair.client([TextReceived(data='{"type":"Finalize"}')])
            text, shown_words = shown(n)
            pair.engine(EngineEndpoint(text=text, words=shown_words, cut=True))
            since = n
    text, shown_words = shown(len(words))
    if ending == "endpoint":
        pair.engine(EngineEndpoint(text=text, words=shown_words))
    else:
        pair.client([TextReceived(data='{"type":"CloseStream"}')])
        pair.engine(EngineFinal(text=text, words=shown_words))
    finals = [
        m["channel"]["alternatives"][0]["transcript"]
        for m in pair.messages
        if m["type"] == "Results" and m["is_final"]
    ]
    assert " ".join(t for t in finals if t).split() == [w.word for w in words]
    if timed:
        assert [w["word"] for w in pair.finals()] == [w.word for w in words]
    finalized = [m for m in pair.messages if m["type"] == "Results" and m["from_finalize"]]
    assert len(finalized) == len(finalize_after)
    assert not any(m["speech_final"] for m in finalized)
    if ending == "final":
        assert pair.messages[-1]["type"] == "Metadata" and pair.close_code == 1000


def test_a_finalize_over_silence_ends_its_window_where_it_was() -> None:
    """A Finalize after 1.5 s of silence, answered (nothing heard) once more audio came: its
    window is 0-1.5 s, and the words said after it are in the next one (its window ran to
    all the audio the session had taken, and the next began after the words)."""
    pair = ListenPair(OPTIONS)
    pair.engine(EngineOpened())
    tenth = b"\x00\x00" * 1600  # 0.1 s: frames within the pair's 4096-byte limit
    pair.client([AudioBatch(frames=(tenth,) * 15)])
    pair.client([TextReceived(data='{"type":"Finalize"}')])
    pair.client([AudioBatch(frames=(tenth,) * 20)])
    pair.engine(EngineEndpoint(text="", cut=True))
    words = (Word(word="go", start=1.7, end=2.0), Word(word="forward", start=2.0, end=2.5))
    pair.engine(EngineEndpoint(text="go forward", words=words))
    finals = [m for m in pair.messages if m["type"] == "Results" and m["is_final"]]
    assert [(m["start"], m["duration"]) for m in finals] == [(0.0, 1.5), (1.5, 1.0)]


# -- each final's window holds its own words ---------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(utterances(), min_size=1, max_size=4), st.floats(0.0, 1.5), st.data())
def test_every_final_window_holds_its_words_and_the_windows_follow_each_other(
    groups: list[list[Word]], late: float, data: st.DataObject
) -> None:
    """The engine decides an utterance ended a pause after its last word; with a short pause
    the next utterance has begun by then (its endpoint's ``audio_seconds`` is past the next
    one's first word). Every final's window still holds all of its words, and each window
    starts where the one before ended (the passage at 0.6 s pauses had the next utterance's
    first word up to 0.7 s before its window)."""
    pair = ListenPair(OPTIONS)
    pair.engine(EngineOpened())
    frame = b"\x00\x00" * 320  # 20 ms
    offset, fed = 0.0, 0
    utterances_ = []
    for group in groups:  # one time line: each utterance after the one before
        shifted = [
            Word(word=w.word, start=round(w.start + offset, 3), end=round(w.end + offset, 3))
            for w in group
        ]
        utterances_.append(shifted)
        offset = shifted[-1].end + data.draw(st.floats(0.05, 1.0))
    assume(offset + late < 25)  # within the session's duration limit (30 s)
    for i, words in enumerate(utterances_):
        # Audio up to a little past this utterance's last word, or into the next one's.
        until = words[-1].end + late
        while fed * 0.02 < until:
            pair.client([AudioBatch(frames=(frame,))])
            fed += 1
        text = " ".join(w.word for w in words)
        pair.engine(EnginePartial(text=text, words=tuple(words)))
        if i == len(utterances_) - 1:
            pair.client([TextReceived(data='{"type":"CloseStream"}')])
            pair.engine(EngineFinal(text=text, words=tuple(words)))
        else:
            pair.engine(EngineEndpoint(text=text, words=tuple(words)))
    finals = [m for m in pair.messages if m["type"] == "Results" and m["is_final"]]
    assert [w["word"] for w in pair.finals()] == [w.word for u in utterances_ for w in u]
    end = 0.0
    for result in finals:
        start, duration = result["start"], result["duration"]
        assert start == pytest.approx(end, abs=1e-3)
        end = start + duration
        for word in result["channel"]["alternatives"][0]["words"]:
            assert start - 1e-3 <= word["start"] and word["end"] <= end + 1e-3, (result, word)


# -- every message parses with the Deepgram SDK's own models ----------------------------------

_SDK_TYPES = {
    "Results": "ListenV1Results",
    "Metadata": "ListenV1Metadata",
    "SpeechStarted": "ListenV1SpeechStarted",
    "UtteranceEnd": "ListenV1UtteranceEnd",
    "Error": "ListenV1Error",
}


def _sdk_validate(message: dict[str, Any]) -> None:
    from deepgram.listen.v1 import types

    model = getattr(types, _SDK_TYPES[message["type"]])
    model.model_validate(message)  # pydantic, strict about required fields and types


def test_every_kind_of_message_validates_with_the_sdk_models() -> None:
    pair = ListenPair(
        ListenOptions(
            model="tiny-test", interim_results=True, vad_events=True, utterance_end_ms=1000
        )
    )
    pair.engine(EngineOpened())
    pair.client([BinaryReceived(data=b"\x00\x00" * 1600)])
    word = Word(word="Hello,", start=0.1, end=0.4, confidence=0.8)
    pair.engine(EnginePartial(text="Hello,", words=(word,)))
    pair.engine(EngineEndpoint(text="Hello,", words=(word,)))
    pair.client([TextReceived(data='{"type":"Finalize"}')])
    pair.engine(EngineEndpoint(text="", words=(), cut=True))  # the runtime's answer
    pair.client([TextReceived(data='{"type":"CloseStream"}')])
    pair.engine(EngineFinal(text="", words=()))
    kinds = [m["type"] for m in pair.messages]
    assert kinds == [
        "SpeechStarted",
        "Results",
        "Results",
        "UtteranceEnd",
        "Results",
        "Results",
        "Metadata",
    ]
    for message in pair.messages:
        _sdk_validate(message)
    results = pair.messages[2]
    assert results["channel"]["alternatives"][0]["words"] == [
        {"word": "hello", "start": 0.1, "end": 0.4, "confidence": 0.8, "punctuated_word": "Hello,"}
    ]
    error = ListenPair(OPTIONS)
    error.client([TextReceived(data="nope")])
    assert [m["type"] for m in error.messages] == ["Error"]
    _sdk_validate(error.messages[0])


def test_an_empty_binary_message_is_deepgrams_older_close_stream() -> None:
    def run(last: list[Any]) -> tuple[list[str], int | None]:
        pair = ListenPair(OPTIONS)
        pair.engine(EngineOpened())
        pair.client([AudioBatch(frames=(b"\x00\x00" * 1600,))])
        pair.client(last)
        pair.engine(EngineFinal(text="hello", words=()))
        return [m["type"] for m in pair.messages], pair.close_code

    close_stream = run([TextReceived(data='{"type":"CloseStream"}')])
    assert close_stream == (["Results", "Metadata"], 1000)
    # One read with audio, the empty message and audio past it: the same, the rest ignored.
    empty = run([AudioBatch(frames=(b"\x00\x00" * 10, b"", b"\x00\x00"))])
    assert empty == close_stream
    assert run([BinaryReceived(data=b"")]) == close_stream  # a whole message, as ASGI gives it
    # The empty last fragment of a message is not one.
    fragments = run([BinaryReceived(data=b"\x00\x00", final=False), BinaryReceived(data=b"")])
    assert fragments != close_stream


def test_the_translator_is_quiet_once_closing() -> None:
    translator = ListenTranslator(OPTIONS, request_id="r", model_uuid="u", created="c")
    translator.closing()
    assert translator.client([TextReceived(data='{"type":"Finalize"}')]) == []
    assert translator.pull_messages() == []


@pytest.mark.parametrize("text", _CONTROL)
def test_messages_before_ready_are_shaped(text: str) -> None:
    pair = ListenPair(OPTIONS)
    pair.client([TextReceived(data=text)])
    pair.finish()
    for message in pair.messages:
        check_message(message)


def test_the_listen_fuzz_seeds_are_current_and_replay_clean() -> None:
    from fuzz import fuzz_listen

    corpus = ROOT / "fuzz" / "corpus" / "listen"
    assert sorted(p.name for p in corpus.iterdir()) == sorted(fuzz_listen.SEEDS)
    for name, data in fuzz_listen.SEEDS.items():
        assert (corpus / name).read_bytes() == data, f"rerun fuzz_listen.py --write-seeds: {name}"
    assert fuzz_listen.replay(corpus) == len(fuzz_listen.SEEDS)
