"""G.711 tables (talkies/app/g711.py) against the standard's fixed points and Python's own
``audioop`` (3.11-3.12; removed in 3.13, where that comparison is skipped), and the
``/v1/listen`` query that selects them."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from talkies.app.g711 import DECODERS, alaw_table, ulaw_table
from talkies.dialects import ListenError, parse_listen_query


def test_fixed_points_of_the_standard() -> None:
    ulaw, alaw = ulaw_table(), alaw_table()
    # μ-law: 0xFF and 0x7F are the two zeros, 0x00 / 0x80 the extremes.
    assert (ulaw[0xFF], ulaw[0x7F], ulaw[0x00], ulaw[0x80]) == (0, 0, -32124, 32124)
    # A-law: the smallest steps around zero (0xD5 / 0x55), the extremes (0xAA / 0x2A).
    assert (alaw[0xD5], alaw[0x55], alaw[0xAA], alaw[0x2A]) == (8, -8, 32256, -32256)
    for table in (ulaw, alaw):
        assert table.dtype == np.int16 and len(np.unique(table)) >= 255  # μ-law: two zeros
        # Symmetric: each code's sign-flipped twin is its negative.
        assert sorted(table.tolist()) == sorted((-table).tolist())


def test_the_tables_are_audioops() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            audioop = importlib.import_module("audioop")
        except ImportError:
            pytest.skip("audioop was removed in Python 3.13")
    every = bytes(range(256))
    assert np.array_equal(np.frombuffer(audioop.ulaw2lin(every, 2), "<i2"), DECODERS["mulaw"])
    assert np.array_equal(np.frombuffer(audioop.alaw2lin(every, 2), "<i2"), DECODERS["alaw"])


def test_the_query_selects_them_at_8_khz_unless_told() -> None:
    options = parse_listen_query("encoding=mulaw", default_model="m")
    assert (options.encoding, options.sample_rate) == ("mulaw", 8000)
    options = parse_listen_query("encoding=ALAW&sample_rate=16000", default_model="m")
    assert (options.encoding, options.sample_rate) == ("alaw", 16000)
    options = parse_listen_query("encoding=linear16", default_model="m")
    assert (options.encoding, options.sample_rate) == ("linear16", 16000)
    with pytest.raises(ListenError, match="linear16, mulaw or alaw"):
        parse_listen_query("encoding=opus", default_model="m")


def test_a_resampler_decodes_odd_sized_telephone_frames() -> None:
    """A G.711 byte is a sample: 81 bytes are 81 samples, not unaligned PCM."""
    from talkies.app.dialects import PcmResampler
    from talkies.protocol import AudioBatch

    resampler = PcmResampler(8000, 65536, decoder=DECODERS["mulaw"])
    tone = (np.sin(np.arange(8000) * 2 * np.pi * 440 / 8000) * 8000).astype(np.int32)
    table = DECODERS["mulaw"].astype(np.int32)
    coded = np.abs(table[None, :] - tone[:, None]).argmin(axis=1).astype(np.uint8).tobytes()
    out = b""
    for i in range(0, len(coded), 81):
        (batch,) = resampler.convert([AudioBatch(frames=(coded[i : i + 81],))])
        assert isinstance(batch, AudioBatch)
        out += b"".join(batch.frames)
    out += b"".join(resampler.tail())
    samples = np.frombuffer(out, "<i2").astype(np.float64)
    assert len(samples) == pytest.approx(16000, abs=64)  # a second at 16 kHz
    spectrum = np.abs(np.fft.rfft(samples[1000:15000] * np.hanning(14000)))
    assert abs(np.argmax(spectrum) * 16000 / 14000 - 440) < 3  # the tone, where it was
