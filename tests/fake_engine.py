"""A small deterministic engine for transport tests (never registered by the product).

It "recognises" energy: every 0.25 s of non-silent audio is one word ``w1``, ``w2`` ...;
0.3 s of silence after speech is an endpoint. It runs behind the real ThreadedStream runner,
in worker threads, so the transport is tested against real thread hops and backpressure.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from talkies import audio
from talkies.engines.base import (
    EngineStream,
    EngineUpdate,
    Recognition,
    Refusal,
    Transcript,
    TranscriptionRequest,
    transcribe_recognition,
)
from talkies.engines.runtime import RecognitionModel
from talkies.engines.runtime.rounds import ThreadedStream
from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial, ErrorCode, Word
from talkies.protocol.messages import StartOptions

WORD_SAMPLES = 4000  # 0.25 s
SILENCE_SAMPLES = 4800  # 0.3 s


@dataclass
class Behaviour:
    delay: float = 0.0  # seconds each accept() spends "decoding"
    fail_on_accept: bool = False
    fail_on_open: bool = False
    open_delay: float = 0.0  # seconds open_stream takes ("loading the model")
    finish_delay: float = 0.0


class EnergyRecognition:
    def __init__(self, behaviour: Behaviour, stats: Stats) -> None:
        self._b = behaviour
        self._stats = stats
        self._voiced = 0  # voiced samples in the current utterance
        self._silence = 0
        self._words: list[Word] = []
        self._t = 0  # samples accepted so far
        self._start: int | None = None

    def _text(self) -> str:
        return " ".join(w.word for w in self._words)

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self._stats.accept_calls += 1
        self._stats.thread_names.add(threading.current_thread().name)
        if self._b.delay:
            time.sleep(self._b.delay)
        if self._b.fail_on_accept:
            raise RuntimeError("fake decoder crashed")
        out: list[EngineUpdate] = []
        samples = struct.unpack(f"<{len(pcm) // 2}h", pcm)
        for value in samples:
            self._t += 1
            if abs(value) > 500:
                self._silence = 0
                if self._start is None:
                    self._start = self._t - 1
                self._voiced += 1
                if self._voiced % WORD_SAMPLES == 0:
                    n = len(self._words) + 1
                    start = self._start / 16000
                    self._words.append(Word(word=f"w{n}", start=start, end=self._t / 16000))
                    self._start = self._t
                    out.append(EnginePartial(text=self._text(), words=tuple(self._words)))
            else:
                self._silence += 1
                if self._silence == SILENCE_SAMPLES and self._words:
                    out.append(EngineEndpoint(text=self._text(), words=tuple(self._words)))
                    self._words = []
                    self._voiced = 0
                    self._start = None
        return out

    def finish(self) -> EngineFinal:
        if self._b.finish_delay:
            time.sleep(self._b.finish_delay)
        final = EngineFinal(text=self._text(), words=tuple(self._words))
        self._words = []
        return final

    def close(self) -> None:
        self._stats.closed += 1


@dataclass
class Stats:
    opened: int = 0
    closed: int = 0
    accept_calls: int = 0
    thread_names: set[str] = field(default_factory=set)


class FakeProvider:
    """Slugs: ``tiny-test`` (instant), ``slow-test`` (``slow_delay`` s per decode and flush call),
    ``slow-open-test`` (opening takes ``slow_delay`` s), ``broken-test`` (decoder raises),
    ``unopenable-test`` (open raises), ``offline-test`` (not streaming-capable)."""

    def __init__(self, max_buffered_bytes: int = 5 * 32000, slow_delay: float = 0.5) -> None:
        self.stats = Stats()
        self._max = max_buffered_bytes
        self._behaviours = {
            "tiny-test": Behaviour(),
            "slow-test": Behaviour(delay=slow_delay, finish_delay=slow_delay),
            "slow-open-test": Behaviour(open_delay=slow_delay),
            "broken-test": Behaviour(fail_on_accept=True),
            "unopenable-test": Behaviour(fail_on_open=True),
        }

    async def open_stream(self, options: StartOptions) -> EngineStream:
        if options.model == "offline-test":
            raise Refusal(ErrorCode.STREAMING_NOT_SUPPORTED, "offline-test cannot stream")
        behaviour = self._behaviours.get(options.model)
        if behaviour is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
        if behaviour.fail_on_open:
            raise RuntimeError("model file missing")
        await anyio.sleep(behaviour.open_delay)

        def create() -> Recognition:  # (again at each cut: the runtime closes the old one)
            self.stats.opened += 1
            return EnergyRecognition(behaviour, self.stats)

        return ThreadedStream(create(), max_buffered_bytes=self._max, create=create)


def speech(seconds: float, amplitude: int = 3000) -> bytes:
    """A square wave: 'voiced' to the fake engine."""
    n = int(seconds * 16000)
    return b"".join(struct.pack("<h", amplitude if (i // 20) % 2 else -amplitude) for i in range(n))


def silence(seconds: float) -> bytes:
    return bytes(int(seconds * 16000) * 2)


class EnergyFileModel(RecognitionModel):
    """The energy recognizer as a loaded model of the pool, streams and files alike (a test
    double: registered under ``energy-*`` slugs only). ``delay`` seconds per decode call."""

    def __init__(self, delay: float = 0.0) -> None:
        self.stats = Stats()
        self._behaviour = Behaviour(delay=delay)

    def recognition(self, options: StartOptions) -> Recognition:
        return EnergyRecognition(self._behaviour, self.stats)

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        return transcribe_recognition(
            self.recognition(StartOptions(model="energy", word_timestamps=True)),
            pcm,
            step=3200,
            language=request.language_code,
            cancel=request.cancel,
        )


def wav_bytes(pcm: bytes) -> bytes:
    """``pcm`` (16 kHz mono s16le) as the bytes of a WAV file."""
    return audio.wav_bytes(pcm, 16000)


def write_wav(path: Path, pcm: bytes) -> Path:
    """``pcm`` (16 kHz mono s16le) as a WAV file at ``path``."""
    path.write_bytes(wav_bytes(pcm))
    return path
