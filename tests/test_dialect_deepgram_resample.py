"""``/v1/listen`` at other sample rates: the 16 kHz the session gets, and how good it is.

talkies/app/dialects.py's PcmResampler (soxr HQ, streaming) measured against the ideal: a
two-tone signal at the client's rate, resampled frame by frame, must match the same tones
synthesized at 16 kHz to better than 75 dB SNR (band-limited content: tones under both
Nyquist limits), and framing changes no sample by more than rounding (a few steps).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.app.dialects import PcmResampler
from talkies.protocol import AudioBatch, BinaryReceived, TextReceived

RATES = [8000, 11025, 22050, 24000, 44100, 48000]
TONES = (440.0, 2500.0)  # under 4 kHz: both below every rate's Nyquist frequency and 16 kHz's


def _tones(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return sum(np.sin(2 * math.pi * f * t) for f in TONES) * 8000


def _resampled(pcm: bytes, rate: int, frame_bytes: int, max_frame: int = 65536) -> bytes:
    resampler = PcmResampler(rate, max_frame)
    out = bytearray()
    for i in range(0, len(pcm), frame_bytes):
        (batch,) = resampler.convert([AudioBatch(frames=(pcm[i : i + frame_bytes],))])
        assert isinstance(batch, AudioBatch)
        out += b"".join(bytes(f) for f in batch.frames)
    out += b"".join(resampler.tail())
    return bytes(out)


def _snr_db(pcm: bytes, reference: np.ndarray) -> float:
    got = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    n = min(len(got), len(reference))
    edge = 800  # 50 ms each end: the filters' start and end
    signal = reference[edge : n - edge]
    noise = got[edge : n - edge] - signal
    return float(10 * np.log10(np.sum(signal**2) / np.sum(noise**2)))


@pytest.mark.parametrize("rate", RATES)
def test_resampled_tones_match_the_ideal_to_60_db(rate: int) -> None:
    pcm = _tones(rate, 2.0).astype("<i2").tobytes()
    frame = (rate // 50) * 2  # 20 ms frames, as clients send them
    out = _resampled(pcm, rate, frame)
    assert abs(len(out) // 2 - 32000) <= 1  # 2 s at 16 kHz
    # Measured 80.4-81.2 dB at every rate here (2026-12-02); int16 itself allows ~90.
    assert _snr_db(out, _tones(16000, 2.0)) > 75


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(RATES), st.lists(st.integers(1, 4000), min_size=1, max_size=20))
def test_framing_changes_no_more_than_rounding(rate: int, sizes: list[int]) -> None:
    """soxr is not bit-exact across chunkings (its float pipeline rounds to int16 per
    chunk, one-sample chunks measured up to 2 steps): the same length, and no sample off by
    more than 4 steps of 65,536 (-84 dBFS)."""
    pcm = _tones(rate, 0.5).astype("<i2").tobytes()
    whole = _resampled(pcm, rate, len(pcm))
    resampler = PcmResampler(rate, 65536)
    out, at = bytearray(), 0
    for size in sizes * 100:
        if at >= len(pcm):
            break
        chunk = pcm[at : at + size * 2]
        at += len(chunk)
        (batch,) = resampler.convert([AudioBatch(frames=(chunk,))])
        assert isinstance(batch, AudioBatch)
        out += b"".join(bytes(f) for f in batch.frames)
    if at < len(pcm):
        (batch,) = resampler.convert([AudioBatch(frames=(pcm[at:],))])
        assert isinstance(batch, AudioBatch)
        out += b"".join(bytes(f) for f in batch.frames)
    out += b"".join(resampler.tail())
    assert len(out) == len(whole)
    diff = np.frombuffer(bytes(out), "<i2").astype(int) - np.frombuffer(whole, "<i2").astype(int)
    assert int(np.abs(diff).max(initial=0)) <= 4


def test_frames_the_session_refuses_pass_as_sent() -> None:
    resampler = PcmResampler(48000, 4096)
    for bad in (b"", b"\x01\x02\x03", bytes(4098)):
        (batch,) = resampler.convert([AudioBatch(frames=(bad,))])
        assert batch == AudioBatch(frames=(bad,))
    text = TextReceived(data="x")
    assert resampler.convert([text]) == [text]


def test_fragments_are_joined_and_upsampled_frames_split() -> None:
    resampler = PcmResampler(8000, 1000)
    pcm = _tones(8000, 0.05).astype("<i2").tobytes()  # 800 bytes -> ~1600 at 16 kHz
    assert resampler.convert([BinaryReceived(data=pcm[:300], final=False)]) == []
    (batch,) = resampler.convert([BinaryReceived(data=pcm[300:])])
    assert isinstance(batch, AudioBatch)
    assert all(0 < len(f) <= 1000 and len(f) % 2 == 0 for f in batch.frames)
    # Fragments over the limit: the whole message, as sent, for the session to refuse.
    resampler.convert([BinaryReceived(data=bytes(600), final=False)])
    (raw,) = resampler.convert([BinaryReceived(data=bytes(600))])
    assert raw == BinaryReceived(data=bytes(1200))


def test_audio_after_the_tail_starts_afresh() -> None:
    """``tail`` ends libsoxr's stream (its last input); audio after it (a Deepgram client's
    frames still queued behind CloseStream) starts a fresh one rather than raising."""
    resampler = PcmResampler(8000, 65536)
    tone = (np.sin(np.arange(1600) / 5) * 8000).astype("<i2").tobytes()  # 0.2 s at 8 kHz
    lengths = []
    for _ in range(2):
        (batch,) = resampler.convert([AudioBatch(frames=(tone,))])
        assert isinstance(batch, AudioBatch)
        lengths.append(sum(len(f) for f in batch.frames) + sum(map(len, resampler.tail())))
    assert lengths == [2 * 3200, 2 * 3200]
