"""Qwen3-TTS on the ``qwen-tts`` package (0.1.1), streamed one codec step at a time.

qwen-tts returns whole waveforms only. Streaming here rides on its internals, which is why
the package is pinned:

- The package's own ``Qwen3TTSForConditionalGeneration.generate`` runs in the synthesis
  worker thread. The talker's ``forward`` is wrapped once at load (``functools.wraps``, because
  HF ``generate`` checks keyword arguments against its signature); each call returns the
  previous step's full 16-codebook frame in ``hidden_states[1]``: one codec step, 1920
  samples. So the streamed codes *are* the buffered ones (equal under greedy decoding).
- Every ``chunk_steps`` frames go through the codec decoder with ``left_context`` (25) earlier
  frames in front, as the package's own ``chunked_decode`` does (a clone's reference codes
  are that context for the first chunk), so the concatenated stream matches a one-shot decode
  to ~2e-5 (measured on the tiny model).
- The worker checks the stream's stop flag at every step (from the wrapped ``forward``), and
  queuing a chunk blocks while the stream's queue is full, which pauses generation.

Model kinds: ``custom_voice`` (named speakers; OpenAI's ``alloy``/``echo``/``fable`` are
aliases for some of them) and ``base`` (voice cloning: the sample voices and custom voices of
:mod:`talkies.engines.tts.voices`). One synthesis runs at a time per model; others wait.
``speed`` must be 1: Qwen3-TTS has no rate control.

Options (a registry entry's ``options``): ``threads`` (torch intra-op threads, default 1;
``torch.set_num_threads`` is process-wide, so it is set at the start of every synthesis),
``left_context`` (frames, default 25), ``queue_chunks`` (chunks a reader may fall behind,
default 2), ``dtype`` (``float32`` on CPU, ``bfloat16`` elsewhere), ``generation`` (qwen-tts
sampling arguments over the model's ``generation_config.json``; ``{"do_sample": false,
"subtalker_dosample": false}`` is greedy), ``voice_aliases`` (voice name -> speaker).
"""

from __future__ import annotations

from pathlib import Path

from ..catalogue import Executor
from ..supply.entry import ModelEntry
from ..tts.base import SpeechModel, auto_device
from .model import Qwen3SpeechModel, load
from .options import (
    DEFAULT_VOICE_ALIASES,
    GENERATION_KEYS,
    LANGUAGE_CODES,
    Qwen3Settings,
    import_qwen_tts,
    resolve_settings,
)

__all__ = [
    "DEFAULT_VOICE_ALIASES",
    "EXECUTORS",
    "GENERATION_KEYS",
    "LANGUAGE_CODES",
    "Qwen3Settings",
    "Qwen3SpeechModel",
    "import_qwen_tts",
    "load",
    "load_entry",
    "resolve_settings",
]


def load_entry(entry: ModelEntry, root: Path, device: str, data_dir: Path) -> SpeechModel:
    """The catalogue's loader: :func:`load` for a registry entry."""
    device = auto_device(device, "torch", lambda torch: bool(torch.cuda.is_available()))
    return load(root, entry.options, device, data_dir, name=entry.slug)


EXECUTORS = (
    Executor(
        name="qwen3_tts",
        kind="tts",
        isolated=True,
        load_speech=load_entry,
        requires=("torch", "transformers", "qwen-tts"),
        # qwen-tts's own metadata asks for gradio and a CUDA torchaudio (README, Models).
        install="the 'qwen3' extra of Talkies, then pip install --no-deps qwen-tts==0.1.1",
    ),
)
