"""The rolling window of one live stream: when to decode, what to commit, and where to cut.

See the package docstring (:mod:`talkies.engines.whisper`) for the policy.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ...protocol import EngineFinal, EnginePartial
from ...protocol.events import SAMPLE_RATE, Word
from ..base import EngineUpdate
from .config import MIN_DECODE_SAMPLES, RollingConfig, commit_samples

__all__ = [
    "DecodeRequest",
    "Decoded",
    "DecodedWord",
    "Decoder",
    "WhisperRecognition",
    "choose_cut",
    "drop_repeated_start",
    "language_to_lock",
    "loops",
    "pcm_samples",
    "repeats_itself",
    "stable_length",
    "transcript_text",
    "transcript_words",
]


@dataclass(frozen=True, slots=True)
class DecodedWord:
    """A word of one decode; times in seconds from the start of the audio decoded."""

    text: str
    start: float
    end: float
    probability: float = 1.0

    def shifted(self, seconds: float) -> DecodedWord:
        return replace(self, start=self.start + seconds, end=self.end + seconds)


@dataclass(frozen=True, slots=True)
class Decoded:
    words: tuple[DecodedWord, ...]
    language: str | None = None  # what whisper.cpp used (detected when asked for "auto")

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    language: str  # a whisper language code, or "auto"
    timestamps: bool  # token-level timestamps (word times)
    final: bool  # words that will be committed or final: one decode, the longer encoder
    prompt: str = ""  # text before the audio, as Whisper's prompt ("": none)
    # Words the transcript of the audio must begin with ("": none): committed words whose
    # audio is decoded again. A backend that can force them as the decoder's prefix
    # (CTranslate2) returns them as its first words, then what it hears after them; one that
    # cannot (whisper.cpp) ignores it, and the caller matches its words against them.
    prefix: str = ""


class Decoder(Protocol):
    """What a rolling stream needs from a model (a fake one in tests)."""

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded: ...


# -- the policy -------------------------------------------------------------------------------


def pcm_samples(carry: bytes, pcm: bytes) -> tuple[npt.NDArray[np.float32], bytes]:
    """PCM16 bytes as float samples, and the odd byte left over for the next call."""
    data = carry + pcm
    usable = len(data) - len(data) % 2
    samples = np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0
    return samples, data[usable:]


def language_to_lock(
    requested: str, locked: str | None, decoded: Decoded, *, samples: int, offset: int
) -> str | None:
    """The language an "auto" stream keeps from now on (``locked`` until one is found):
    detection on a few seconds is reliable enough; per-window detection is not."""
    if (
        requested == "auto"
        and locked is None
        and decoded.language not in (None, "auto")
        and (samples >= 3 * SAMPLE_RATE or offset > 0)
    ):
        return decoded.language
    return locked


def transcript_text(committed: Sequence[DecodedWord], tail: Sequence[DecodedWord]) -> str:
    return " ".join(w.text for w in (*committed, *tail))


def stable_length(committed: Sequence[DecodedWord]) -> int:
    """The ``stable`` of a partial whose text is :func:`transcript_text` of ``committed`` and
    a tail: the committed words' joined text, which the utterance's end begins with."""
    return len(" ".join(w.text for w in committed))


def transcript_words(
    committed: Sequence[DecodedWord], tail: Sequence[DecodedWord], *, timed: bool
) -> tuple[Word, ...]:
    """The committed and open words as the protocol's words (none unless ``timed``)."""
    if not timed:
        return ()
    return tuple(
        Word(word=w.text, start=w.start, end=w.end, confidence=w.probability)
        for w in (*committed, *tail)
    )


# Words more that the last hypothesis heard than a final decode of the same audio, for the
# final decode to be taken as ended early (WhisperRecognition._final_decode).
_ENDED_EARLY = 2
_LOOP_RATIO = 2.4  # a decode's text compresses this well when it loops (loops())


def loops(text: str) -> bool:
    """Whether ``text`` repeats itself as a decode that loops does: Whisper's check, a gzip
    compression ratio over 2.4 (openai-whisper's ``compression_ratio_threshold``)."""
    data = text.encode("utf-8")
    return bool(data) and len(data) / len(zlib.compress(data)) > _LOOP_RATIO


_REPEAT_PROBE = 4  # words


def repeats_itself(words: Sequence[DecodedWord], start: int) -> bool:
    """Whether ``words[start:]`` begins with a run of :data:`_REPEAT_PROBE` words found
    earlier in ``words`` (ignoring case and punctuation): a decode saying again what it
    already said. Fewer words after ``start`` are not judged (two words such as "he was"
    recur in any long window)."""
    norm = [_norm(w) for w in words]
    probe = norm[start : start + _REPEAT_PROBE]
    if len(probe) < _REPEAT_PROBE or not all(probe):
        return False
    return any(norm[i : i + _REPEAT_PROBE] == probe for i in range(start - _REPEAT_PROBE + 1))


def choose_cut(words: Sequence[DecodedWord], window: float, keep: float) -> tuple[float, int]:
    """Where to cut a full window: (seconds from its start, number of words committed).

    Commits the longest run of leading words that end by ``window - keep``; cuts halfway into
    the pause after the last of them (never past the next word's start or ``window - keep``).
    See the module docstring for the fallbacks.
    """
    limit = window - keep
    count = 0
    for word in words:
        if word.end > limit:
            break
        count += 1
    if count == 0:
        return (window - keep, 0) if not words else (window, len(words))
    cut = words[count - 1].end
    if count < len(words):
        following = min(words[count].start, limit)
        if following > cut:
            cut = (cut + following) / 2
    else:
        cut = max(cut, limit)  # nothing after them: drop the silence up to the kept tail
    return cut, count


def _norm(word: DecodedWord) -> str:
    return "".join(c for c in word.text.casefold() if c.isalnum() or c == "'")


def drop_repeated_start(
    committed: Sequence[DecodedWord], words: tuple[DecodedWord, ...], most: int = 4
) -> tuple[DecodedWord, ...]:
    """``words`` without leading words that repeat the end of ``committed``.

    The cut falls in the pause Whisper's timestamps place after the last committed word;
    those timestamps are approximate, so the next window may begin with the tail of that
    word (a fricative is enough) and Whisper hears the word again. Up to ``most`` words that
    equal, ignoring case and punctuation, the last committed ones are dropped. The price: a
    genuine repetition exactly at a cut ("very very") loses one copy.
    """
    if not committed or not words:
        return words
    tail = [_norm(w) for w in committed[-most:]]
    head = [_norm(w) for w in words[:most]]
    for k in range(min(len(tail), len(head)), 0, -1):
        if tail[-k:] == head[:k] and all(head[:k]):
            return words[k:]
    return words


@dataclass(slots=True)
class _Hypothesis:
    """The latest decode of the current window, in stream time."""

    words: tuple[DecodedWord, ...] = ()
    covers: int = 0  # samples of the window it decoded
    final: bool = False  # a final-quality decode (longer encoder, word times)


@dataclass(slots=True)
class WhisperRecognition:
    """One rolling stream; see the package docstring for the policy."""

    decoder: Decoder
    config: RollingConfig
    language: str
    word_timestamps: bool = False
    interim_results: bool = True
    n_audio_ctx: int = 1500  # the model's encoder length (bounds a commit's span)
    _audio: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, np.float32))
    _carry: bytes = b""
    _offset: int = 0  # samples committed and dropped before the window
    _heard: int = 0  # samples accepted since the stream began
    _due: int = 0  # the next refresh's grid point in _heard samples (0: one period)
    _undecoded: int = 0  # samples of the window the last decode did not cover
    _committed: list[DecodedWord] = field(default_factory=list)
    _tail: _Hypothesis = field(default_factory=_Hypothesis)
    _locked_language: str | None = None

    # -- Recognition -----------------------------------------------------------------------

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        return self.accept_samples(self._samples(pcm))

    def accept_samples(
        self, samples: npt.NDArray[np.float32], *, refresh: bool = True
    ) -> Sequence[EngineUpdate]:
        """``accept`` for float samples. ``refresh=False`` buffers them (committing at
        window overflow, which bounds the buffer) without a hypothesis decode: the caller
        (:mod:`.utterances`) knows the utterance ends right after them."""
        if samples.size == 0:
            return []
        self._audio = np.concatenate([self._audio, samples])
        self._heard += samples.size
        self._undecoded += samples.size
        period = self.config.refresh_samples
        decoded = False
        while self._audio.size > self.config.window_samples:
            self._commit()  # covers the whole backlog (up to its span): the newest audio
            decoded = True
        due = self._heard >= (self._due or period)
        if refresh and self.interim_results and self._undecoded and due:
            self._refresh()
            decoded = True
        if not decoded:
            return []
        # Refreshes keep to a grid of refresh periods in stream time, not "a period after the
        # last decode": each hypothesis decode takes the earliest grid point not yet taken, so
        # one point missed behind a long decode (a commit) is made up by the next round, but
        # never more than one: a backlog is one decode, not one per period it covers.
        self._due = max((self._due or period) + period, self._heard // period * period)
        if not self.interim_results:
            return []
        return [
            EnginePartial(
                text=self._text(self._tail.words),
                words=self._words(self._tail.words),
                stable=stable_length(self._committed),
            )
        ]

    def finish(self) -> EngineFinal:
        tail = self._tail.words
        if self._audio.size >= MIN_DECODE_SAMPLES and not (
            self._tail.final and self._tail.covers == self._audio.size
        ):
            tail = self._final_decode(self._audio, self.word_timestamps, self._tail.words)
        elif self._audio.size < MIN_DECODE_SAMPLES:
            tail = ()
        return EngineFinal(text=self._text(tail), words=self._words(tail))

    def close(self) -> None:
        self._audio = np.zeros(0, np.float32)

    # -- introspection (tests, benchmarks) --------------------------------------------------

    @property
    def buffered_seconds(self) -> float:
        return self._audio.size / SAMPLE_RATE

    @property
    def language_found(self) -> str | None:
        """The language detected and kept for an "auto" stream (None until then)."""
        return self._locked_language

    @property
    def committed_text(self) -> str:
        return " ".join(w.text for w in self._committed)

    # -- internals --------------------------------------------------------------------------

    def _samples(self, pcm: bytes) -> npt.NDArray[np.float32]:
        samples, self._carry = pcm_samples(self._carry, pcm)
        return samples

    def _language(self) -> str:
        return self._locked_language or self.language

    def _decode(
        self, audio: npt.NDArray[np.float32], *, timestamps: bool, final: bool
    ) -> tuple[DecodedWord, ...]:
        request = DecodeRequest(language=self._language(), timestamps=timestamps, final=final)
        decoded = self.decoder.decode(audio, request)
        self._locked_language = language_to_lock(
            self.language, self._locked_language, decoded, samples=audio.size, offset=self._offset
        )
        seconds = self._offset / SAMPLE_RATE
        words = tuple(w.shifted(seconds) for w in decoded.words)
        return drop_repeated_start(self._committed, words)

    def _final_decode(
        self,
        audio: npt.NDArray[np.float32],
        timestamps: bool,
        heard: Sequence[DecodedWord],
    ) -> tuple[DecodedWord, ...]:
        """A final-quality decode of ``audio`` (a commit's window, or the utterance's end),
        where ``heard`` are the last hypothesis's words of the same audio.

        Beam search (CTranslate2's ``final_beam_size``) can close its segment and end before
        the audio does, the last word it kept stretched to the end: a 25 s utterance's final
        ended "... more respectable than" where every hypothesis and the file route heard
        "... than he was." When the hypothesis heard at least two words more, the audio is
        decoded again greedily, as the hypotheses are, and that is kept if it too heard at
        least two words more than the beam (a word or so either way is how beam and greedy
        decodes differ, and the beam's is kept then) and its words beyond the beam's do not
        loop: a greedy decode can go on repeating what it heard to the end of its token
        budget, which Whisper's own check (a gzip compression ratio over 2.4, as
        openai-whisper and faster-whisper use it) tells of a long loop, and
        :func:`repeats_itself` of a sentence said again once or twice (a backlogged stream's
        final had "Unless to be rather cold-hearted ... ill-disposed." three times)."""
        words = self._decode(audio, timestamps=timestamps, final=True)
        if len(heard) >= len(words) + _ENDED_EARLY:
            greedy = self._decode(audio, timestamps=timestamps, final=False)
            extra = " ".join(w.text for w in greedy[len(words) :])
            if (
                len(greedy) >= len(words) + _ENDED_EARLY
                and not loops(extra)
                and not repeats_itself(greedy, len(words))
            ):
                return greedy
        return words

    def _commit(self) -> None:
        span = commit_samples(self.config, n_audio_ctx=self.n_audio_ctx)
        window = self._audio[:span]
        start = self._offset / SAMPLE_RATE
        end = (self._offset + window.size) / SAMPLE_RATE
        heard = [w for w in self._tail.words if w.start < end]
        words = self._final_decode(window, True, heard)
        relative = [w.shifted(-start) for w in words]
        cut_seconds, count = choose_cut(
            relative, window.size / SAMPLE_RATE, self.config.keep_seconds
        )
        cut = min(window.size, max(1, round(cut_seconds * SAMPLE_RATE)))
        self._committed.extend(words[:count])
        self._audio = self._audio[cut:]
        self._offset += cut
        remaining = window.size - cut  # of the decoded window, still buffered
        self._tail = _Hypothesis(words=words[count:], covers=remaining, final=True)
        self._undecoded = self._audio.size - remaining

    def _refresh(self) -> None:
        words = self._decode(self._audio, timestamps=self.word_timestamps, final=False)
        self._tail = _Hypothesis(words=words, covers=self._audio.size)
        self._undecoded = 0

    def _text(self, tail: Sequence[DecodedWord]) -> str:
        return transcript_text(self._committed, tail)

    def _words(self, tail: Sequence[DecodedWord]) -> tuple[Word, ...]:
        return transcript_words(self._committed, tail, timed=self.word_timestamps)
