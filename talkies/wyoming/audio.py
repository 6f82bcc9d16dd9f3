"""A Wyoming client's audio, in whatever format it declares, as the 16 kHz mono s16le PCM
every ASR engine here takes."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..protocol.events import SAMPLE_RATE

__all__ = ["MAX_CHANNELS", "RATE_RANGE", "WIDTHS", "AudioFormatError", "PcmConverter"]

RATE_RANGE = (4000, 192000)
WIDTHS = (1, 2, 4)  # bytes per sample: signed 8, 16 and 32-bit little-endian (audioop's)
MAX_CHANNELS = 8
_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype("i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4")}


class AudioFormatError(ValueError):
    """A declared format this server does not take; the message is client-safe."""


def _int_field(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise AudioFormatError(f"audio {key} must be an integer")
    return value


def audio_format(data: dict[str, Any]) -> tuple[int, int, int]:
    """(rate, width, channels) of an ``audio-start`` or ``audio-chunk``'s data, checked."""
    rate, width, channels = (_int_field(data, k) for k in ("rate", "width", "channels"))
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        raise AudioFormatError(f"audio rate must be {RATE_RANGE[0]}-{RATE_RANGE[1]} Hz")
    if width not in WIDTHS:
        raise AudioFormatError(f"audio width must be one of {', '.join(map(str, WIDTHS))} bytes")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioFormatError(f"audio channels must be 1-{MAX_CHANNELS}")
    return rate, width, channels


class PcmConverter:
    """One stream's audio: interleaved samples of ``width`` bytes at ``rate`` Hz in, 16 kHz
    mono s16le out. Chunks may split a frame; the rest waits for the next chunk."""

    def __init__(self, rate: int, width: int, channels: int) -> None:
        self.format = (rate, width, channels)
        self._frame = width * channels
        self._dtype = _DTYPES[width]
        self._scale = float(2 ** (8 * width - 1))
        self._channels = channels
        self._rest = b""
        self._resampler: Any = None
        if rate != SAMPLE_RATE:
            try:
                soxr = importlib.import_module("soxr")
            except ImportError:
                raise AudioFormatError(
                    f"audio at {rate} Hz needs the soxr package on the server (talkies[wyoming]); "
                    f"send {SAMPLE_RATE} Hz"
                ) from None
            self._resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
        self.seconds = 0.0  # audio taken so far, at the client's rate
        self._rate = rate

    def convert(self, data: bytes, *, last: bool = False) -> bytes:
        data = self._rest + data
        usable = len(data) - len(data) % self._frame
        self._rest = data[usable:]
        frames = usable // self._frame
        self.seconds += frames / self._rate
        if self._dtype == np.dtype("<i2") and self._channels == 1 and self._resampler is None:
            return data[:usable]
        samples = np.frombuffer(data[:usable], self._dtype).astype(np.float32) / self._scale
        if self._channels > 1:
            samples = samples.reshape(-1, self._channels).mean(axis=1)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        clipped = np.clip(samples, -1.0, 1.0)
        return bytes(np.rint(clipped * 32767.0).astype("<i2").tobytes())
