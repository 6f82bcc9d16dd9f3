"""The CTranslate2 backend (executor ``whisper_ct2``): a faster-whisper folder run as it is,
int8 on CPU by default, behind the same seam as whisper.cpp (:class:`~.model.BaseWhisperModel`).

- **Features** are computed here in numpy (:func:`~.features.log_mel`, OpenAI's recipe);
  CTranslate2 takes the log-mel spectrogram, not samples.
- **Encoder length.** CTranslate2 (4.x) encodes any number of frames up to 30 s, so a live
  decode encodes what :func:`~.config.encoder_positions` says, exactly as whisper.cpp's
  ``audio_ctx`` does: partials just the window, commits and finals ``final_audio_ctx``.
- **Decoding**: greedy (``beam_size`` 1; ``final_beam_size`` for the decodes whose words
  are kept: finals, commits, a file's), timestamp tokens on (Whisper's native mode, as
  for whisper.cpp), no text carried between calls (but a request's ``prefix``, committed
  words decoded again, is forced as the transcript's first tokens, and its ``prompt``,
  committed text before the audio, is Whisper's prompt as for whisper.cpp), no temperature
  fallback, CTranslate2's default suppression of non-speech symbols, a bound on tokens per
  second of audio.
- **Word times** come from cross-attention alignment (``Whisper.align``: the alignment heads
  of ``config.json``, a median filter and dynamic time warping, as faster-whisper does),
  asked for only when the decode needs them (commits, finals, word timestamps): one more
  decoder pass over the tokens, on the encoder output already computed.
- **Files**: Whisper's own 30 s seek loop over a window's features, segments cut at pairs of
  timestamp tokens (OpenAI's ``transcribe``); the request's prompt conditions the first 30 s.
  A cancelled request stops between CTranslate2 calls (an encode or a 30 s decode).
- **Sharing**: one CTranslate2 model object; ``contexts`` is its number of workers
  (``inter_threads``: the weights are shared, unlike whisper.cpp contexts), ``threads`` the
  threads of each (``intra_threads``). CTranslate2 releases the GIL while it computes.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE, Word
from ..base import EngineUnavailable, TranscriptionCancelled, TranscriptionRequest
from ..base import TranscriptSegment as Segment
from ..supply.entry import ModelEntry
from .config import MIN_DECODE_SAMPLES, RollingConfig, encoder_positions, resolve_config
from .ct2 import Ct2Checkpoint, Ct2FormatError
from .features import CHUNK_FRAMES, HOP, log_mel
from .markers import speech_mask, strip_markers
from .model import BaseWhisperModel
from .rolling import Decoded, DecodedWord, DecodeRequest
from .tokens import MAX_TEXT_CTX, Vocabulary, max_length

__all__ = ["Ct2WhisperModel", "load_ct2"]

log = logging.getLogger("talkies.engines")

_SECONDS_PER_POSITION = 0.02  # an encoder position (and a timestamp token): 20 ms
_PAST_END = 0.06  # seconds: a word that starts this close to the audio's end has no audio
_MEDIAN_FILTER = 7  # of the attention weights before alignment (OpenAI's and faster-whisper's)


@dataclass(frozen=True, slots=True)
class _Token:
    """A text token of a decode with its aligned times (seconds from the audio's start)."""

    id: int
    start: float
    end: float
    probability: float


class Ct2WhisperModel(BaseWhisperModel):
    """A faster-whisper (CTranslate2) Whisper folder on CTranslate2."""

    def __init__(
        self,
        folder: Path,
        config: RollingConfig,
        *,
        device: str = "cpu",
        slug: str = "whisper",
    ) -> None:
        super().__init__(config, slug=slug)
        self.path = folder
        try:
            ct2: Any = importlib.import_module("ctranslate2")
        except ImportError as exc:
            raise EngineUnavailable(
                "the whisper_ct2 executor needs ctranslate2 (pip install 'talkies[whisper]')"
            ) from exc
        self._ct2 = ct2
        try:
            with Ct2Checkpoint(folder / "model.bin") as checkpoint:
                if checkpoint.spec != "WhisperSpec":
                    raise Ct2FormatError(f"spec {checkpoint.spec!r} is not WhisperSpec")
                self.n_audio_ctx = checkpoint.shape("encoder/position_encodings/encodings")[0]
            self.vocabulary = Vocabulary.read(folder)
        except (Ct2FormatError, OSError) as exc:
            raise EngineUnavailable(
                f"model {slug!r}: not a CTranslate2 Whisper folder: {exc}"
            ) from None
        kind, _, index = device.partition(":")
        try:
            self._model: Any = ct2.models.Whisper(
                str(folder),
                device="cuda" if kind == "cuda" else "cpu",
                device_index=int(index or 0),
                compute_type=config.compute_type,
                intra_threads=config.threads,
                inter_threads=config.contexts,
            )
        except (RuntimeError, ValueError) as exc:
            raise EngineUnavailable(f"model {slug!r}: CTranslate2 cannot load it: {exc}") from None
        self.multilingual = bool(self._model.is_multilingual)
        self.n_mels = int(self._model.n_mels)
        self.compute_type = str(self._model.compute_type)
        # Word times by cross-attention alignment need the heads config.json names.
        self.aligns = _has_alignment_heads(folder / "config.json")
        if not self.aligns:
            log.warning(
                "model %r: config.json names no alignment_heads (an old conversion): word "
                "times are spread between timestamp tokens",
                slug,
            )
        self._count_lock = threading.Lock()
        self._ready()

    # -- languages -----------------------------------------------------------------------------

    def _language_code(self, code: str) -> str | None:
        if not self.multilingual:
            # An English-only vocabulary has no language tokens: English is all it knows.
            return "en" if code == "en" else (code if code.isalpha() else None)
        return code if self.vocabulary.language_token(code) is not None else None

    def _start(self, language: str) -> list[int]:
        return self.vocabulary.start(language if self.multilingual else None)

    def _detect(self, encoded: Any) -> str:
        """The most probable language of encoded audio (a multilingual model)."""
        ranked = self._model.detect_language(encoded)[0]
        token = str(ranked[0][0])
        return token.removeprefix("<|").removesuffix("|>")

    # -- the seam: live decodes ------------------------------------------------------------

    def _encode(self, features: npt.NDArray[np.float32]) -> Any:
        if self._closed:
            raise RuntimeError("the whisper model was closed")
        view = self._ct2.StorageView.from_array(np.ascontiguousarray(features[None]))
        return self._model.encode(view, to_cpu=False)

    def _counted(self) -> None:
        with self._count_lock:
            self.decodes += 1

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        """Transcribe ``audio`` (float32 mono 16 kHz): encode what the request's encoder
        length holds, generate (greedily; a final by beam search if ``final_beam_size`` says
        so), align the words when times are asked for."""
        if audio.size < MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(MIN_DECODE_SAMPLES - audio.size, np.float32)])
        positions = encoder_positions(
            self.config, final=request.final, n_audio_ctx=self.n_audio_ctx, samples=audio.size
        )
        encoded = self._encode(log_mel(audio, self.n_mels, frames=2 * positions))
        language = request.language
        if language == "auto":
            language = self._detect(encoded) if self.multilingual else "en"
        start = self._start(language)
        # Text before the audio (the agreement policies' committed text once an utterance
        # was trimmed), as the file route's prompt.
        prompt = self.vocabulary.prompted(self.vocabulary.prompt_text(request.prompt), start)
        forced = prompt
        if request.prefix.strip():
            # The request's words forced as the transcript's start (after the first timestamp
            # token, as faster-whisper's ``prefix``): CTranslate2 returns them as the first
            # tokens of the sequence, then what it decodes after them.
            given = self.vocabulary.encode(" " + request.prefix.strip())
            forced = [*prompt, self.vocabulary.timestamp_begin, *given[-(MAX_TEXT_CTX // 2) :]]
        # A bound on runaway repetition: ~12 tokens a second of audio is far above speech.
        budget = 32 + math.ceil(audio.size / SAMPLE_RATE * 12)
        # Beam search (``final_beam_size``) only for the words that are kept; a partial is
        # greedy. CTranslate2 forces the prefix on every beam alike and returns the best
        # hypothesis first (``num_hypotheses`` 1). What follows a long forced prefix is not
        # always a greedy decode's: the best beam can end right after it (its score is
        # mostly the forced words'), which AgreementRecognition.finish makes up for.
        beam = self.config.final_beam_size if request.final else 1
        result = self._model.generate(
            encoded,
            [forced],
            beam_size=beam,
            max_length=max_length(prompt, budget + len(forced) - len(prompt)),
            suppress_blank=True,
        )[0]
        self._counted()
        sequence = list(result.sequences_ids[0])
        text = [t for t in sequence if t < self.vocabulary.eot]
        frames = min(audio.size // HOP, 2 * positions)
        if request.timestamps and text and self.aligns:
            tokens = self._align(encoded, start, text, frames)
        elif request.timestamps:
            tokens = self._spread(sequence, audio.size / SAMPLE_RATE)
        else:
            tokens = [_Token(t, 0.0, 0.0, 1.0) for t in text]
        words = self._words(tokens)
        if forced is not prompt and request.timestamps and self.aligns:
            # Forced into a prefix, Whisper may go on past the audio's end with the whole
            # utterance again (measured on base, partials): words aligned to the last frames.
            forced_words = len(request.prefix.split())
            end = frames * HOP / SAMPLE_RATE - _PAST_END
            words = [w for k, w in enumerate(words) if k < forced_words or w.start < end]
        return Decoded(words=tuple(words), language=language)

    def _spread(self, sequence: list[int], limit: float) -> list[_Token]:
        """Text tokens timed from the timestamp tokens around them, spread evenly: the word
        times of a folder without alignment heads (converted by an old CTranslate2)."""
        begin = self.vocabulary.timestamp_begin
        out: list[_Token] = []
        pending: list[int] = []
        start = 0.0

        def flush(end: float) -> None:
            step = (end - start) / len(pending)
            out.extend(
                _Token(t, start + step * i, start + step * (i + 1), 1.0)
                for i, t in enumerate(pending)
            )
            pending.clear()

        for token in sequence:
            if token >= begin:
                # A timestamp past the audio's end (beam search of a weak model finds them)
                # times nothing after the end.
                at = min((token - begin) * _SECONDS_PER_POSITION, limit)
                if pending:
                    flush(max(at, start))
                start = at
            elif token < self.vocabulary.eot:
                pending.append(token)
        if pending:
            flush(max(limit, start))
        return out

    def _align(self, encoded: Any, prompt: list[int], text: list[int], frames: int) -> list[_Token]:
        """Each text token's times, from cross-attention alignment (faster-whisper's
        ``find_alignment``): a token starts where the alignment path first reaches it."""
        result = self._model.align(
            encoded, prompt, [text], max(2, frames), median_filter_width=_MEDIAN_FILTER
        )[0]
        pairs = np.asarray(result.alignments, dtype=np.int64).reshape(-1, 2)
        probabilities = [float(p) for p in result.text_token_probs]
        if pairs.size == 0:
            return [_Token(t, 0.0, 0.0, 1.0) for t in text]
        jumps = np.diff(pairs[:, 0], prepend=-1).astype(bool)
        times = pairs[jumps, 1] * _SECONDS_PER_POSITION  # where tokens 0..n (n: end) begin
        if times.size < len(text) + 1:  # a path that never reached the last tokens
            times = np.concatenate([times, np.full(len(text) + 1 - times.size, times[-1])])
        return [
            _Token(
                token,
                float(times[k]),
                float(max(times[k], times[k + 1])),
                probabilities[k] if k < len(probabilities) else 1.0,
            )
            for k, token in enumerate(text)
        ]

    def _groups(self, tokens: Sequence[_Token]) -> list[tuple[str, list[_Token]]]:
        """Text tokens grouped into words: a token with a leading space starts one."""
        groups: list[list[_Token]] = []
        for token in tokens:
            if not groups or self.vocabulary.piece(token.id).startswith(b" "):
                groups.append([])
            groups[-1].append(token)
        out = []
        for group in groups:
            text = self.vocabulary.text([t.id for t in group]).strip()
            if text:
                out.append((text, group))
        keep = speech_mask([text for text, _ in out])
        return [item for item, speech in zip(out, keep, strict=True) if speech]

    def _words(self, tokens: Sequence[_Token]) -> list[DecodedWord]:
        return [
            DecodedWord(
                text,
                group[0].start,
                max(group[0].start, group[-1].end),
                float(np.mean([t.probability for t in group])),
            )
            for text, group in self._groups(tokens)
        ]

    # -- the seam: a file's window ---------------------------------------------------------

    def _transcribe_window(
        self,
        samples: npt.NDArray[np.int16],
        request: TranscriptionRequest,
        language: str,
        cancel: threading.Event | None,
    ) -> tuple[str, tuple[Segment, ...]]:
        """One window of a file, 30 s of features at a time (OpenAI's seek loop)."""
        audio = samples.astype(np.float32) / np.float32(32768.0)
        duration = audio.size / SAMPLE_RATE
        if audio.size < MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(MIN_DECODE_SAMPLES - audio.size, np.float32)])
        features = log_mel(audio, self.n_mels)  # the audio's frames + 30 s of silence
        content = audio.size // HOP
        prompt_text = self.vocabulary.prompt_text(request.prompt)
        segments: list[Segment] = []
        seek = 0
        while seek < content:
            if cancel is not None and cancel.is_set():
                raise TranscriptionCancelled("the transcription was cancelled")
            size = min(CHUNK_FRAMES, content - seek)
            encoded = self._encode(features[:, seek : seek + CHUNK_FRAMES])
            if language == "auto":
                language = self._detect(encoded) if self.multilingual else "en"
            start = self._start(language)
            prompt = self.vocabulary.prompted(prompt_text if seek == 0 else [], start)
            if cancel is not None and cancel.is_set():
                raise TranscriptionCancelled("the transcription was cancelled")
            result = self._generate_file(encoded, prompt, request.temperature)
            self._counted()
            tokens = list(result.sequences_ids[0])
            found, advance = self._split(tokens, size)
            offset = seek * HOP / SAMPLE_RATE
            timed = self._file_times(encoded, start, found, size, request)
            for (first, last, seg_tokens), words in zip(found, timed, strict=True):
                text = strip_markers(self.vocabulary.text(seg_tokens).strip())
                if not text:
                    continue
                seg_start = min(offset + first, duration)
                seg_end = min(max(offset + last, seg_start), duration)
                if segments:
                    seg_start = max(seg_start, segments[-1].start)
                    seg_end = max(seg_end, seg_start)
                segments.append(
                    Segment(
                        id=len(segments),
                        start=seg_start,
                        end=seg_end,
                        text=text,
                        words=self._file_words(words, offset, duration)
                        if request.word_timestamps
                        else (),
                        tokens=tuple(seg_tokens),
                        avg_logprob=self._avg_logprob(result, len(tokens)),
                        temperature=float(request.temperature),
                    )
                )
            seek += max(1, advance)
        return language, tuple(segments)

    def _generate_file(self, encoded: Any, prompt: list[int], temperature: float) -> Any:
        # Temperature 0: beam search of ``final_beam_size`` (a file is decoded once, as a
        # final is); above it, sampling, which beams do not go with (as faster-whisper).
        sampling: dict[str, Any] = {"beam_size": self.config.final_beam_size}
        if temperature > 0:
            sampling = {
                "beam_size": 1,
                "sampling_topk": 0,
                "sampling_temperature": float(temperature),
            }
        return self._model.generate(
            encoded,
            [prompt],
            max_length=max_length(prompt, MAX_TEXT_CTX),
            return_scores=True,
            suppress_blank=True,
            **sampling,
        )[0]

    @staticmethod
    def _avg_logprob(result: Any, length: int) -> float | None:
        scores = list(getattr(result, "scores", ()) or ())
        if not scores:
            return None
        # CTranslate2 scores a hypothesis by its log-probability over its length (length
        # penalty 1, greedy or beam); Whisper's avg_logprob counts end-of-text too
        # (faster-whisper's).
        return float(scores[0]) * length / (length + 1)

    def _split(
        self, tokens: list[int], size: int
    ) -> tuple[list[tuple[float, float, list[int]]], int]:
        """A 30 s decode's segments ``(start, end, tokens)`` in seconds from its start, and
        the frames it consumed: OpenAI's rules for timestamp tokens (a pair of them ends a
        segment; a decode that does not end on a single one is resumed from its last)."""
        begin = self.vocabulary.timestamp_begin
        is_time = [t >= begin for t in tokens]
        single_ending = is_time[-2:] == [False, True]
        pairs = [k + 1 for k in range(len(tokens) - 1) if is_time[k] and is_time[k + 1]]
        window = size * HOP / SAMPLE_RATE
        if not pairs:
            times = [t for t in tokens if t >= begin]
            end = window
            if times and times[-1] != begin:
                end = (times[-1] - begin) * _SECONDS_PER_POSITION
            first = (tokens[0] - begin) * _SECONDS_PER_POSITION if is_time[:1] == [True] else 0.0
            return [(first, end, tokens)], size
        cuts = [*pairs, len(tokens)] if single_ending else pairs
        found = []
        last = 0
        for cut in cuts:
            piece = tokens[last:cut]
            first = (piece[0] - begin) * _SECONDS_PER_POSITION if piece[0] >= begin else 0.0
            end = (piece[-1] - begin) * _SECONDS_PER_POSITION if piece[-1] >= begin else window
            found.append((first, end, piece))
            last = cut
        if single_ending:
            return found, size
        resume = (tokens[last - 1] - begin) * 2  # a timestamp position is 2 frames
        return found, resume if 0 < resume <= size else size

    def _file_times(
        self,
        encoded: Any,
        start: list[int],
        found: list[tuple[float, float, list[int]]],
        size: int,
        request: TranscriptionRequest,
    ) -> list[list[_Token]]:
        """Each segment's text tokens with times (aligned all at once when word times were
        asked for, as faster-whisper does; untimed otherwise)."""
        texts = [[t for t in seg_tokens if t < self.vocabulary.eot] for _, _, seg_tokens in found]
        flat = [t for text in texts for t in text]
        if request.word_timestamps and flat and self.aligns:
            timed = self._align(encoded, start, flat, size)
        elif request.word_timestamps:
            timed = self._spread([t for _, _, seg in found for t in seg], size * HOP / SAMPLE_RATE)
        else:
            timed = [_Token(t, 0.0, 0.0, 1.0) for t in flat]
        out: list[list[_Token]] = []
        pos = 0
        for text in texts:
            out.append(timed[pos : pos + len(text)])
            pos += len(text)
        return out

    def _file_words(self, tokens: list[_Token], offset: float, duration: float) -> tuple[Word, ...]:
        words: list[Word] = []
        floor = 0.0
        for word in self._words(tokens):
            begin = min(max(offset + word.start, floor), duration)
            end = min(max(begin, offset + word.end), duration)
            floor = begin
            words.append(Word(word=word.text, start=begin, end=end, confidence=word.probability))
        return tuple(words)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        model = getattr(self, "_model", None)
        if model is not None:
            model.unload_model()
            self._model = None


def _has_alignment_heads(config: Path) -> bool:
    try:
        heads = json.loads(config.read_text(encoding="utf-8")).get("alignment_heads")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(heads, list) and bool(heads)


def load_ct2(entry: ModelEntry, root: Path, device: str) -> Ct2WhisperModel:
    """Load the entry's faster-whisper folder (blocking: call from a worker thread)."""
    try:
        config = resolve_config(entry.options)
    except ValueError as exc:
        raise EngineUnavailable(f"model {entry.slug!r}: {exc}") from None
    if not (root / "model.bin").is_file() or not (root / "config.json").is_file():
        raise EngineUnavailable(
            f"model {entry.slug!r}: the whisper_ct2 executor needs a faster-whisper "
            "(CTranslate2) folder: model.bin, config.json and the vocabulary"
        )
    return Ct2WhisperModel(root, config, device=device, slug=entry.slug)
