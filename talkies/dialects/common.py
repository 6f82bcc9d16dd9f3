"""What every translator in this package writes the same way: the compact JSON of the wire,
the native ``start`` a dialect's stream opens with, and a client's value quoted in an error.
Pure, like the translators (no I/O, no clock)."""

from __future__ import annotations

import json
from typing import Any

from ..protocol import AudioBatch, BinaryReceived, CutRequested, PeerGone, TextReceived

__all__ = ["DUMPS", "ClientInput", "native_start", "quote"]

# What a host's channel delivers, and what the native session is given back (the driver's
# ClientMessage, declared here so that this package needs nothing of app/).
ClientInput = AudioBatch | TextReceived | BinaryReceived | CutRequested | PeerGone

# Compact JSON, non-ASCII kept, NaN refused: what the native session and both dialects send.
DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def native_start(model: str, language: str | None) -> str:
    """The native ``start`` a dialect opens: 16 kHz PCM (the app resamples before the
    session), always with interim results and word times, which a dialect needs to answer
    its own events (a Deepgram ``Finalize``, a Realtime ``speech_started``) and drops where
    its client did not ask for them."""
    start: dict[str, Any] = {
        "type": "start",
        "model": model,
        "encoding": "pcm_s16le",
        "sample_rate": 16000,
        "channels": 1,
        "interim_results": True,
        "word_timestamps": True,
    }
    if language is not None:
        start["language"] = language
    return DUMPS(start)


def quote(text: str, limit: int = 48) -> str:
    """``text`` as JSON, cut to ``limit`` characters: a client's value shown in an error
    without letting the client write the error."""
    shown = json.dumps(text, ensure_ascii=True)
    return shown if len(shown) <= limit else shown[: limit - 4] + '..."'
