"""ITU-T G.711 μ-law and A-law, the 8-bit telephone codings (Twilio's media streams send
μ-law at 8 kHz), decoded to 16-bit linear PCM by a 256-entry table: one byte is one sample.

The tables are computed here from the standard's segment rules, with the scaling of
Python's ``audioop`` (``ulaw2lin``/``alaw2lin`` at width 2, which the tests compare them
with, value by value): μ-law spans ±32124, A-law ±32256.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["DECODERS", "alaw_table", "ulaw_table"]


def ulaw_table() -> npt.NDArray[np.int16]:
    """The 16-bit sample of each μ-law byte."""
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def alaw_table() -> npt.NDArray[np.int16]:
    """The 16-bit sample of each A-law byte."""
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


# By the name Deepgram's ``encoding`` gives each.
DECODERS = {"mulaw": ulaw_table(), "alaw": alaw_table()}
