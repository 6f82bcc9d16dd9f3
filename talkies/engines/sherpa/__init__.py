"""sherpa-onnx online recognizers; live streams batched through the engine runtime.

:func:`load` builds ``sherpa_onnx.OnlineRecognizer.<recognizer_factory>(**kwargs)`` from a
registry entry (:mod:`.config`): relative model paths in ``sherpa_config`` resolve under the
model's root and may not leave it; every other key is passed through, checked against the
factory's signature. The provider comes from ``TALKIES_DEVICE`` (:func:`select_provider`).

Each client stream owns one sherpa ``OnlineStream`` (:mod:`.decoder`) and runs in the one
engine-stream runtime (:mod:`talkies.engines.runtime.rounds`), like every engine's. With ``batch:
true`` (the default) its recognition offers ``decode_many``: each round of the model decodes
one chunk of *every* ready stream with a single ``decode_streams`` call (at most
``max_batch`` streams per call), again and again while some are still ready (for at most
~20 ms, then new audio gets its turn), so N live streams cost about one batched encoder run
per chunk instead of N. Audio moves into a stream's native buffer only once its decodable
chunks are done, so the runtime's bounded queue absorbs a client that is too fast. With
``batch: false`` each stream decodes its own chunks (``decode_stream``) in the same rounds.

Entry ``options``: ``batch`` (bool, default true), ``max_batch`` (1-1024, default 16),
``max_wait`` (seconds a round that starts from idle waits for the other streams' audio,
0-1, default 0.005), ``tail_padding`` (seconds of silence decoded after ``end`` so the last
frames reach the model, 0-5, default 0.66).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ...protocol.messages import StartOptions
from ..base import EngineUnavailable, PcmSource, Transcript, TranscriptionRequest
from ..base import transcribe_recognition as _transcribe
from ..catalogue import Executor
from ..runtime import RecognitionModel
from ..runtime.rounds import DecodeRounds
from ..supply.entry import ModelEntry
from .config import SherpaOptions, recognizer_kwargs, select_provider
from .decoder import (
    BatchedSherpaRecognition,
    DecodeCounters,
    NativeRecognizer,
    SherpaRecognition,
    StreamDecoder,
    words_from_tokens,
)

__all__ = [
    "EXECUTORS",
    "SHERPA_FACTORIES",
    "BatchedSherpaRecognition",
    "SherpaModel",
    "SherpaOptions",
    "SherpaRecognition",
    "StreamDecoder",
    "check_entry",
    "load",
    "recognizer_kwargs",
    "select_provider",
    "words_from_tokens",
]

log = logging.getLogger("talkies.engines")

# Bytes of PCM per accept() in a whole-file transcription: 0.1 s.
_FILE_STEP = 3200
# The OnlineRecognizer constructors an entry's recognizer_factory may name.
SHERPA_FACTORIES = frozenset(
    {"from_transducer", "from_paraformer", "from_wenet_ctc", "from_zipformer2_ctc"}
)


def check_entry(entry: ModelEntry) -> list[str]:
    """The registry's checks of the fields only sherpa entries take."""
    where = f"model {entry.slug!r}"
    out = []
    if not entry.sherpa_config:
        out.append(f"{where}: sherpa_config must be a non-empty object")
    if entry.recognizer_factory not in SHERPA_FACTORIES:
        out.append(
            f"{where}: recognizer_factory must be one of "
            f"{', '.join(sorted(SHERPA_FACTORIES))}, got {entry.recognizer_factory!r}"
        )
    return out


def load(entry: ModelEntry, root: Path, device: str) -> SherpaModel:
    """Build the entry's online recognizer (blocking: run it in a worker thread)."""
    where = f"model {entry.slug!r}"
    factory_name = entry.recognizer_factory
    if factory_name not in SHERPA_FACTORIES:
        raise ValueError(
            f"{where}: recognizer_factory must be one of {', '.join(sorted(SHERPA_FACTORIES))},"
            f" got {factory_name!r}"
        )
    options = SherpaOptions.parse(entry.slug, entry.options)
    provider = select_provider(device)
    import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]

    factory = getattr(sherpa_onnx.OnlineRecognizer, factory_name)
    kwargs = recognizer_kwargs(entry.slug, factory, entry.sherpa_config, root, provider)
    started = time.perf_counter()
    try:
        recognizer = factory(**kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(f"{where}: sherpa-onnx rejected the configuration: {exc}") from exc
    log.info(
        "sherpa model loaded",
        extra={
            "model": entry.slug,
            "factory": factory_name,
            "provider": provider[0],
            "device_index": provider[1],
            "batch": options.batch,
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
    return SherpaModel(recognizer, options, slug=entry.slug)


class SherpaModel(RecognitionModel):
    """A loaded sherpa-onnx online recognizer (a :class:`~talkies.engines.base.LoadedModel`)."""

    def __init__(self, recognizer: Any, options: SherpaOptions, *, slug: str) -> None:
        self.recognizer: NativeRecognizer = recognizer
        self.options = options
        self.slug = slug
        self.counters = DecodeCounters()
        self._closed = False

    def decode_rounds(self) -> DecodeRounds:
        if not self.options.batch:
            return DecodeRounds()  # one decode per stream: as many rounds as cores
        # Batched: one round at a time, so every ready stream joins the same decode_streams
        # calls (two rounds side by side split the batch: 8 streams fed at once got 1.9
        # chunks per call instead of 4.8). sherpa's num_threads parallelizes one call.
        # Coming out of idle, a round waits max_wait for the other streams' audio.
        return DecodeRounds(parallel=1, gather=self.options.max_wait)

    def recognition(self, options: StartOptions) -> SherpaRecognition:
        """A live stream's recognition: batched with the model's others unless ``batch:
        false``."""
        if self._closed:
            raise EngineUnavailable(f"model {self.slug!r} was unloaded")
        if not self.options.batch:
            return self.alone(options)
        return BatchedSherpaRecognition(
            self.recognizer,
            options,
            self.options.tail_padding,
            self.counters,
            max_batch=self.options.max_batch,
        )

    def alone(self, options: StartOptions) -> SherpaRecognition:
        """A stream decoded on its own, whatever the mode (tests, whole files)."""
        return SherpaRecognition(self.recognizer, options, self.options.tail_padding, self.counters)

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        """A whole file through an ``OnlineStream`` of its own, decoded on the calling thread,
        never batched with live streams (a :class:`~talkies.engines.base.FileTranscriber`;
        blocking). Fed 0.1 s per call, so a segment ends within 0.1 s after the chunk where
        sherpa found its endpoint; ``request.cancel`` is checked between calls.
        """
        options = StartOptions(
            model=self.slug, interim_results=False, word_timestamps=request.word_timestamps
        )
        return _transcribe(
            self.alone(options),
            audio,
            step=_FILE_STEP,
            language=request.language_code,
            cancel=request.cancel,
        )

    def close(self) -> None:
        # Streams still open keep the native recognizer alive through their references.
        self._closed = True
        log.info("sherpa model closed", extra={"model": self.slug})


EXECUTORS = (
    Executor(
        name="sherpa",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load,
        check_entry=check_entry,
        requires=("sherpa-onnx",),
    ),
)
