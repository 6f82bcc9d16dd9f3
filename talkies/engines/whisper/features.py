"""Whisper's log-mel features in numpy, for decoders that take features rather than samples
(CTranslate2: :mod:`.ctranslate`).

The computation is OpenAI's ``whisper/audio.py`` ``log_mel_spectrogram``: a 400-point STFT
(periodic Hann window, hop 160, centred with reflect padding, the last frame dropped), power
spectrum, the Slaney mel bank (:func:`~.ct2ggml.mel_filters`, equal to the one OpenAI ships),
``log10`` clamped at 1e-10, floored at 8 below its maximum, then ``(x + 4) / 4``. As in
``transcribe``, the audio is padded with 30 s of digital silence before the features are
taken, so a window shorter than 30 s sees what Whisper saw in training after it.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE
from .ct2ggml import mel_filters

__all__ = ["CHUNK_FRAMES", "HOP", "N_FFT", "log_mel"]

N_FFT = 400
HOP = 160
CHUNK_FRAMES = 30 * SAMPLE_RATE // HOP  # Whisper's window: 3000 frames of 10 ms

Array = npt.NDArray[np.float32]


@functools.cache
def _window() -> Array:
    # torch.hann_window(400) is periodic: cos over N, not N - 1.
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


@functools.cache
def _filters(n_mels: int) -> Array:
    bank = mel_filters(n_mels)
    bank.setflags(write=False)
    return bank


def log_mel(audio: npt.NDArray[np.float32], n_mels: int = 80, frames: int | None = None) -> Array:
    """``[n_mels, frames]`` features of ``audio`` (float32 mono 16 kHz).

    ``frames`` defaults to every frame of the audio plus Whisper's 30 s of padding; a given
    count is taken from the start (the audio is padded with silence as far as it needs).
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    content = audio.size // HOP
    wanted = content + CHUNK_FRAMES if frames is None else frames
    total = max(audio.size + CHUNK_FRAMES * HOP, wanted * HOP)
    padded = np.zeros(total + N_FFT, np.float32)  # centred: N_FFT // 2 each side
    padded[N_FFT // 2 : N_FFT // 2 + audio.size] = audio
    # Reflect padding at the start; the end is silence either way (the 30 s of padding).
    head = audio[1 : N_FFT // 2 + 1][::-1]
    padded[N_FFT // 2 - head.size : N_FFT // 2] = head
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:wanted]
    spectrum = np.fft.rfft(windows * _window(), axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    mel = _filters(n_mels) @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    # The floor is relative to the loudest frame of the audio with its padding, which only
    # the whole padded signal has: the padding is silence, so the audio's frames decide it.
    log_spec = np.maximum(log_spec, log_spec.max(initial=-10.0) - 8.0)
    out: Array = ((log_spec + 4.0) / 4.0).astype(np.float32)
    return out
