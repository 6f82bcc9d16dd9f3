"""A Piper voice split at its decoder, so a sentence's audio streams in pieces.

A Piper voice is one ONNX graph (VITS): phoneme ids -> text encoder, duration predictor, flow
-> latent frames ``z`` (one per 256 samples) -> HiFi-GAN decoder -> audio. The decoder is
about two thirds of the time and is a stack of convolutions: a window of ``z`` decoded with
:data:`PAD` frames of context on each side gives the same samples as the whole sentence
decoded at once (measured on ``en_US-joe-medium``: 60 dB SNR against the whole at 8 frames,
above 120 dB at 12; :data:`PAD` is 10). So a sentence is encoded whole, then decoded
:data:`FIRST_FRAMES` frames first (about 0.28 s of speech, sent as soon as it exists) in
pieces that double up to :data:`FRAMES`.

The graph is cut in memory at the decoder's first node, ``/dec/conv_pre/Conv`` (the name
torch gives it in every voice exported by Piper's ``export_onnx``), with the ``onnx``
package; a voice without that node is synthesized a sentence at a time instead.

Piper scales each sentence to its own peak, which cannot be known before its last piece: a
streamed voice has one gain instead, measured once when it is loaded (:func:`voice_gain`),
so its sentences are also equally loud.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FIRST_FRAMES", "FRAMES", "PAD", "SplitVoice", "split_voice", "voice_gain", "windows"]

log = logging.getLogger("talkies.engines")

DECODER_NODE = "/dec/conv_pre/Conv"
FIRST_FRAMES = 24  # the first piece of a sentence: 24 x 256 samples, 0.28 s at 22,050 Hz
FRAMES = 96  # the largest piece (fewer, larger runs: each piece's context is decoded twice)
PAD = 10  # frames of context decoded on each side of a piece and thrown away
# Spoken once at load to measure the voice's level; its peak is set to _PEAK.
_CALIBRATION = "The quick brown fox jumps over the lazy dog, then rests in the warm sun."
_PEAK = 0.9


def windows(frames: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each piece of ``frames`` latent frames, in order, covering them.

    The pieces double from :data:`FIRST_FRAMES` to :data:`FRAMES`, so each is made while
    the ones before it play (on a machine at least twice as fast as real time), and a tail
    shorter than the first piece joins the piece before it (its context would cost more
    than it)."""
    start, size = 0, FIRST_FRAMES
    while start < frames:
        end = start + size
        if frames - end < FIRST_FRAMES:
            end = frames
        yield start, end
        start, size = end, min(FRAMES, size * 2)


@dataclass(frozen=True)
class SplitVoice:
    """A voice's two halves: ``encoder`` (the graph's inputs -> ``z``) and ``decoder``
    (``z`` -> audio), onnxruntime sessions."""

    encoder: Any
    decoder: Any
    z_name: str
    hop: int  # samples per latent frame

    def encode(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """The sentence's latent frames, (1, channels, frames)."""
        wanted = {i.name for i in self.encoder.get_inputs()}
        z = self.encoder.run(None, {k: v for k, v in feeds.items() if k in wanted})[0]
        return np.asarray(z, dtype=np.float32)

    def decode(self, z: np.ndarray) -> Iterator[np.ndarray]:
        """The audio of ``z``, a piece per window, each decoded with its context."""
        frames = z.shape[2]
        for start, end in windows(frames):
            lo, hi = max(0, start - PAD), min(frames, end + PAD)
            piece = np.ascontiguousarray(z[:, :, lo:hi])
            audio = np.asarray(self.decoder.run(None, {self.z_name: piece})[0]).reshape(-1)
            first = (start - lo) * self.hop
            yield audio[first : first + (end - start) * self.hop].astype(np.float32)


def split_voice(
    model_path: Path, ort: Any, session_options: Any, providers: list[Any], hop: int
) -> SplitVoice | None:
    """The voice at ``model_path`` cut at its decoder (blocking), or None when it cannot be
    (no ``onnx`` package, or a graph without Piper's decoder node)."""
    try:
        onnx = importlib.import_module("onnx")
        importlib.import_module("onnx.utils")
    except ImportError:
        log.info("piper: the onnx package is missing; each sentence is synthesized whole")
        return None
    model = onnx.load(str(model_path))
    node = next((n for n in model.graph.node if n.name == DECODER_NODE), None)
    if node is None:
        log.info(
            "piper: %s has no %s; each sentence is synthesized whole", model_path, DECODER_NODE
        )
        return None
    z_name = str(node.input[0])
    inputs = [i.name for i in model.graph.input]
    output = model.graph.output[0].name
    extractor = onnx.utils.Extractor(model)
    halves = [
        extractor.extract_model(inputs, [z_name]),
        extractor.extract_model([z_name], [output]),
    ]
    encoder, decoder = (
        ort.InferenceSession(
            half.SerializeToString(), sess_options=session_options, providers=providers
        )
        for half in halves
    )
    return SplitVoice(encoder=encoder, decoder=decoder, z_name=z_name, hop=hop)


def voice_gain(split: SplitVoice, feeds: Mapping[str, np.ndarray]) -> float:
    """The gain that brings the calibration sentence (given as ``feeds``) to a peak of
    :data:`_PEAK` (blocking: it synthesizes it)."""
    audio = np.concatenate(list(split.decode(split.encode(feeds))))
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    return _PEAK / peak if peak > 1e-4 else 1.0


def calibration_text() -> str:
    """What :func:`voice_gain` is given to speak."""
    return _CALIBRATION
