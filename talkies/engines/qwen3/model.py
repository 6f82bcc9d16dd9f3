"""Qwen3-TTS: the loaded model and its synthesis (:mod:`talkies.engines.qwen3`)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..base import EngineUnavailable
from ..tts.base import (
    SAMPLE_RATE,
    Emitter,
    SpeechError,
    SpeechErrorKind,
    SpeechRequest,
    SpeechStream,
    check_request,
    pcm16,
    start_synthesis,
)
from ..tts.voices import SAMPLE_VOICES, ReferenceVoice, list_custom_voices, read_reference_audio
from ..tts.voices import reference_voice as find_reference_voice
from ..tts.voices import sample_voice as find_sample_voice
from .options import (
    CLONE_PROMPT_CACHE,
    LANGUAGE_CODES,
    Qwen3Settings,
    import_qwen_tts,
    plain_text,
    resolve_settings,
)

log = logging.getLogger("talkies.engines")


# -- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """A validated request, resolved to what generation needs."""

    text: str
    language: str  # a Qwen3 language name, or "auto"
    speaker: str | None = None  # custom_voice
    reference: ReferenceVoice | None = None  # base
    instructions: str | None = None


class _ChunkDecoder:
    """Turns codec frames into PCM chunks of ``chunk_steps`` frames, with left context."""

    def __init__(
        self,
        decoder: Any,
        *,
        samples_per_step: int,
        left_context: int,
        chunk_steps: int,
        context: Any,
        emit: Callable[[bytes], None],
    ) -> None:
        import torch

        self._torch = torch
        self._decoder = decoder
        self._step = samples_per_step
        self._left = left_context
        self._chunk = chunk_steps
        self._context = context[-left_context:] if context is not None and left_context else None
        self._emit = emit
        self._pending: list[Any] = []
        self.frames: list[Any] = []

    def add(self, frame: Any) -> None:
        self._pending.append(frame)
        self.frames.append(frame)
        if len(self._pending) >= self._chunk:
            self._flush()

    def finish(self) -> None:
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        torch = self._torch
        new = torch.stack(self._pending)
        self._pending = []
        codes = new if self._context is None else torch.cat([self._context.to(new.device), new])
        wav = self._decoder(codes.clamp(min=0).transpose(0, 1).unsqueeze(0))  # (1, 1, samples)
        start = (codes.shape[0] - new.shape[0]) * self._step
        audio = wav[0, 0, start : start + new.shape[0] * self._step]
        self._context = codes[-self._left :] if self._left else None
        self._emit(pcm16(audio.float().cpu().numpy()))


class Qwen3SpeechModel:
    """A loaded Qwen3-TTS model (``custom_voice`` or ``base``)."""

    sample_rate = SAMPLE_RATE
    streaming = True

    def __init__(
        self,
        tts: Any,
        *,
        settings: Qwen3Settings,
        data_dir: Path | None = None,
        name: str = "qwen3-tts",
    ) -> None:
        model = tts.model
        self.kind = str(model.tts_model_type)
        if self.kind not in ("custom_voice", "base"):
            raise ValueError(f"model type {self.kind!r} is not supported (custom_voice, base)")
        if model.tokenizer_type != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"speech tokenizer {model.tokenizer_type!r} is not supported (12 Hz)")
        self.name = name
        self._tts = tts
        self._settings = settings
        self._data_dir = data_dir
        self._codec = model.speech_tokenizer.model
        self.samples_per_step = int(self._codec.get_decode_upsample_rate())
        if int(self._codec.get_output_sample_rate()) != SAMPLE_RATE:
            raise ValueError(f"the speech tokenizer does not output {SAMPLE_RATE} Hz audio")
        self._languages = sorted(str(x).lower() for x in model.get_supported_languages() or ())
        self._speakers = sorted(str(x).lower() for x in model.get_supported_speakers() or ())
        self._aliases = {
            alias: speaker.lower()
            for alias, speaker in settings.voice_aliases.items()
            if speaker.lower() in self._speakers
        }
        # qwen-tts drops instructions for its 0.6B CustomVoice model; Base has none.
        self._instructions = self.kind == "custom_voice" and model.tts_model_size != "0b6"
        self._generate_kwargs = tts._merge_generate_kwargs(**settings.generation)
        self._lock = threading.Lock()  # one synthesis at a time; held by the worker thread
        self._sink: Callable[[Any], None] | None = None
        self._prompts: OrderedDict[tuple[object, ...], Any] = OrderedDict()
        self._closed = False
        self.last_codes: npt.NDArray[np.int64] | None = None  # of the last finished synthesis
        self._install_step_hook()

    def _install_step_hook(self) -> None:
        talker = self._tts.model.talker
        forward = talker.forward

        @functools.wraps(forward)
        def stepping_forward(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            sink = self._sink
            if sink is not None:
                sink(out.hidden_states[1])  # None on the prompt's (prefill) pass
            return out

        talker.forward = stepping_forward

    # -- voices and validation --------------------------------------------------------------

    def voices(self) -> list[str]:
        if self.kind == "custom_voice":
            return [*self._aliases, *(s for s in self._speakers if s not in self._aliases)]
        names = [n for n in SAMPLE_VOICES if find_sample_voice(n) is not None]
        if self._data_dir is not None:
            names += [n for n in list_custom_voices(self._data_dir) if n not in names]
        return names

    def languages(self) -> list[str]:
        """Language names this model takes ("auto" among them)."""
        return list(self._languages)

    def _language(self, requested: str | None) -> str:
        if requested is None:
            return "auto"
        name = requested.strip().lower()
        name = LANGUAGE_CODES.get(name.split("-")[0].split("_")[0], name)
        if name not in self._languages:
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT,
                f"unsupported language {requested[:32]!r}; use one of {', '.join(self._languages)}",
                param="language",
            )
        return name

    def _plan(self, request: SpeechRequest) -> _Plan:
        check_request(request, speed_range=(1.0, 1.0))
        language = self._language(request.language)
        instructions = request.instructions if self._instructions else None
        if request.instructions and not instructions:
            log.debug("qwen3: %s model ignores instructions", self.kind)
        if self.kind == "custom_voice":
            voice = request.voice.lower()
            speaker = self._aliases.get(voice, voice)
            if speaker not in self._speakers:
                raise SpeechError(
                    SpeechErrorKind.UNKNOWN_VOICE,
                    f"unknown voice {request.voice[:128]!r}",
                    param="voice",
                )
            return _Plan(request.text, language, speaker=speaker, instructions=instructions)
        reference = find_reference_voice(self._data_dir, request.voice)
        return _Plan(request.text, language, reference=reference)

    def validate(self, request: SpeechRequest) -> None:
        self._plan(request)

    # -- synthesis --------------------------------------------------------------------------

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        """Stream ``request``: chunks of ``chunk_steps`` codec steps (the last may be shorter)."""
        if chunk_steps < 1:
            raise ValueError("chunk_steps must be at least 1")
        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        plan = self._plan(request)
        return start_synthesis(
            functools.partial(self._stream, plan, chunk_steps),
            lock=self._lock,
            max_chunks=self._settings.queue_chunks,
            name=self.name,
        )

    def generate_codes(self, request: SpeechRequest) -> npt.NDArray[np.int64]:
        """The whole utterance's codec frames (steps, 16) in one call, without streaming.

        Blocking (waits for the model's lock): for tests and tools.
        """
        plan = self._plan(request)
        with self._lock, self._inference():
            inputs, _ = self._prepare(plan)
            codes, _ = self._tts.model.generate(**inputs, **self._generate_kwargs)
        return np.asarray(codes[0].cpu().numpy(), dtype=np.int64)

    @contextlib.contextmanager
    def _inference(self) -> Iterator[None]:
        import torch

        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        if torch.get_num_threads() != self._settings.threads:
            torch.set_num_threads(self._settings.threads)
        with torch.no_grad():
            yield

    def _prepare(self, plan: _Plan) -> tuple[dict[str, Any], Any]:
        """``generate`` arguments for ``plan``, as qwen-tts's own generate_* methods build them,
        and the reference codes that precede the output (None unless cloning in context)."""
        tts = self._tts
        input_ids = tts._tokenize_texts([tts._build_assistant_text(plain_text(plan.text))])
        if plan.reference is None:
            instruct = None
            if plan.instructions:
                prompt = tts._build_instruct_text(plain_text(plan.instructions))
                instruct = tts._tokenize_texts([prompt])[0]
            inputs = {
                "input_ids": input_ids,
                "instruct_ids": [instruct],
                "languages": [plan.language],
                "speakers": [plan.speaker],
                "non_streaming_mode": True,  # generate_custom_voice's default
            }
            return inputs, None
        item = self._clone_prompt(plan.reference)
        ref_ids = None
        if item.ref_text:
            ref_ids = tts._tokenize_texts([tts._build_ref_text(plain_text(item.ref_text))])[0]
        inputs = {
            "input_ids": input_ids,
            "ref_ids": [ref_ids],
            "voice_clone_prompt": tts._prompt_items_to_voice_clone_prompt([item]),
            "languages": [plan.language],
            "non_streaming_mode": False,  # generate_voice_clone's default
        }
        return inputs, item.ref_code

    def _clone_prompt(self, voice: ReferenceVoice) -> Any:
        """The voice's clone prompt (reference codes + speaker embedding), cached by file."""
        stat = voice.audio.stat()
        key = (str(voice.audio), stat.st_mtime_ns, stat.st_size, voice.transcript)
        item = self._prompts.get(key)
        if item is not None:
            self._prompts.move_to_end(key)
            return item
        audio, rate = read_reference_audio(voice)
        (item,) = self._tts.create_voice_clone_prompt(
            ref_audio=(audio, rate),
            ref_text=voice.transcript,
            x_vector_only_mode=voice.transcript is None,
        )
        self._prompts[key] = item
        while len(self._prompts) > CLONE_PROMPT_CACHE:
            self._prompts.popitem(last=False)
        return item

    def _stream(self, plan: _Plan, chunk_steps: int, emitter: Emitter) -> None:
        """The worker thread's job (the model's lock is held)."""
        eos = int(self._tts.model.config.talker_config.codec_eos_token_id)
        with self._inference():
            inputs, ref_code = self._prepare(plan)
            decoder = _ChunkDecoder(
                self._codec.decoder,
                samples_per_step=self.samples_per_step,
                left_context=self._settings.left_context,
                chunk_steps=chunk_steps,
                context=ref_code,
                emit=emitter.emit,
            )

            def on_step(codes: Any) -> None:
                if codes is None:
                    emitter.check()
                    return
                emitter.step()
                frame = codes[0]
                if int(frame[0]) != eos:  # never for one utterance; as qwen-tts cuts there
                    decoder.add(frame)

            self._sink = on_step
            try:
                self._tts.model.generate(**inputs, **self._generate_kwargs)
            finally:
                self._sink = None
            decoder.finish()
        if decoder.frames:
            frames = np.stack([f.cpu().numpy() for f in decoder.frames])
            self.last_codes = frames.astype(np.int64)
        else:
            self.last_codes = np.zeros((0, 16), np.int64)

    def close(self) -> None:
        with self._lock:  # after any running synthesis
            self._closed = True
            self._prompts.clear()
            self._sink = None
        log.debug("qwen3: model %r closed", self.name)


def load(
    root: Path,
    options: Mapping[str, Any],
    device: str,
    data_dir: Path | None = None,
    *,
    name: str = "qwen3-tts",
) -> Qwen3SpeechModel:
    """Load the Qwen3-TTS model folder ``root`` (blocking: call from a worker thread).

    ``data_dir`` holds ``custom-voices/`` for a Base model. Raises
    :class:`~talkies.engines.base.EngineUnavailable` with a client-safe message.
    """
    try:
        settings = resolve_settings(options, device)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
    try:
        qwen_tts = import_qwen_tts()
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise EngineUnavailable(
            f"model {name!r} needs the qwen-tts and torch packages (talkies[qwen3]): {exc}"
        ) from None
    kwargs: dict[str, Any] = {"dtype": getattr(torch, settings.dtype)}
    if device != "cpu":
        kwargs["device_map"] = device
    try:
        tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(root), **kwargs)
    except Exception as exc:
        log.exception("qwen3: loading %s failed", root)
        raise EngineUnavailable(f"model {name!r}: could not load the Qwen3-TTS model") from exc
    try:
        return Qwen3SpeechModel(tts, settings=settings, data_dir=data_dir, name=name)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
