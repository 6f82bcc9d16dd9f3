"""The commit policy of an open utterance: LocalAgreement-2 (whisper_streaming's).

An utterance (:mod:`.utterances`) is decoded again every ``refresh_seconds`` of new audio: a
*hypothesis* of all its audio not yet trimmed (the *buffer*). The policy, after Macháček,
Dabre and Bojar, "Turning Whisper into Real-Time Transcription System" (2023), and their
``whisper_streaming``:

- **Agreement.** The words of a hypothesis after those already committed
  (:func:`after_committed`) are compared with the previous hypothesis's; their longest
  common prefix (:func:`agreed_prefix`: words equal ignoring case and punctuation) is what
  the two agree on.
- **Commit and trim when the buffer is long.** Once the buffer is longer than
  ``trim_seconds`` (10 s; two thirds of what one decode holds at most), the agreed words are
  committed, less those that end in its last :data:`CONTEXT_SECONDS` (3 s; a third of the
  trim length at most) or in the last :data:`MARGIN_SECONDS` of the audio the hypothesis
  decoded (a word the audio cuts is a guess, and two guesses can agree), and its audio up
  to the end of the last committed word is dropped:
  later decodes start there, with the 3 s or more of audio after it as context and, with
  ``prompt``, the committed text as Whisper's prompt. A committed word is never revised nor
  dropped: every later partial, the endpoint and the final start with the committed words.
- **Nothing is committed earlier**, unless ``early`` (policy "early" of :mod:`.utterances`).
  whisper_streaming commits every agreed word at once; here an utterance shorter than the
  trim length is decoded whole at its end, with its full context, and nothing of it is
  frozen before: committing agreed words of short utterances cost 4 errors in 71 words on
  the pause passage of ``bench/whisper_live.py`` (whisper.cpp, WER 0.070 against 0.014),
  where two hypotheses of a sentence cut short agreed on a mishearing ("rather cold and",
  "Howdy a more amiable woman") that the whole decode got right.
- **Early commits** (``early``): at every hypothesis, the words three hypotheses agree on,
  then those the last two agree on that both heard with probability
  :data:`EARLY_CONFIDENCE` or more, are committed (less those in the last
  :data:`MARGIN_SECONDS` of the audio), so that partials announce them as stable (the
  protocol's ``stable``) about a second after they were said. Their audio is not trimmed:
  every later decode hears the whole utterance again, with the committed words inside the
  buffer forced as the decoder's ``prefix`` (CTranslate2; whisper.cpp cannot, and its words
  are matched to them by :func:`after_committed`), so the endpoint's decode is the committed
  words and what the whole audio says after them. The cost is the mishearings two
  hypotheses agree on, frozen (docs/engines.md).
- **A faster start** (``early``, ``first_refresh_seconds``, 0.25 s by default): until the
  utterance's first commit, in its first :data:`FIRST_SECONDS`, it is decoded every
  ``first_refresh_seconds`` instead of every ``refresh_seconds``, and a hypothesis of less
  than :data:`AGREE_SECONDS` of audio is agreed with only by one three quarters of
  ``refresh_seconds`` later or more (:meth:`AgreementRecognition._witnesses`): Whisper on
  under a second of audio drops or guesses a weak first word ("And", "Unless"), and
  hypotheses a quarter of a second apart agree on the guess (measured, docs/engines.md). The
  first word is stable sooner, for a few more decodes per utterance.
- **The end** (an endpoint, the final) decodes the buffer whole once with the longer encoder
  (``final``) and appends its words after the committed ones.
- **Bound.** A buffer that reaches what one decode holds (:func:`~.config.commit_samples`,
  about 15 s) with no agreement to trim at (noise, a model that keeps changing its mind,
  ``interim_results`` off: no hypotheses at all) is committed by the timestamp cut of
  :mod:`.rolling` (:func:`~.rolling.choose_cut`): its words that end a ``keep_seconds``
  before its end, the audio cut in the pause after them.

It is not the default (:mod:`.utterances`, ``policy``): on 29.7 s of reading with no pause
(``bench/whisper_live.py --clip reading --min-silence 3``) it lost words at its trims (WER
0.070 without the prompt, 0.042 with it) where the timestamp cut lost none (0.014, the file
route's): whisper.cpp's token times, which both trust, are off by a few tenths, and this
policy cuts twice as often (every ~7 s against every ~14 s). Word times from alignment
(CTranslate2's ``align``) may change that; measure before switching.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from ...protocol import EngineFinal, EnginePartial
from ...protocol.events import SAMPLE_RATE, Word
from ..base import EngineUpdate
from .config import MIN_DECODE_SAMPLES, RollingConfig, commit_samples
from .rolling import (
    DecodedWord,
    Decoder,
    DecodeRequest,
    choose_cut,
    drop_repeated_start,
    language_to_lock,
    pcm_samples,
    stable_length,
    transcript_text,
    transcript_words,
)

__all__ = [
    "AGREE_SECONDS",
    "CONTEXT_SECONDS",
    "EARLY_CONFIDENCE",
    "FIRST_SECONDS",
    "MARGIN_SECONDS",
    "PROMPT_CHARACTERS",
    "TRIM_SECONDS",
    "AgreementRecognition",
    "after_committed",
    "agreed_prefix",
    "norm",
]

MARGIN_SECONDS = 0.3  # an agreed word is committed once this much audio follows it
TRIM_SECONDS = 10.0  # a buffer longer than this is trimmed at a committed word
CONTEXT_SECONDS = 3.0  # of audio a trim leaves before the end of the buffer, at least
EARLY_CONFIDENCE = 0.5  # early: agreed words this probable in both hypotheses commit at once
PROMPT_CHARACTERS = 200  # of the committed text, given as the prompt (whisper_streaming's)
FIRST_SECONDS = 2.0  # early: of an utterance, decoded every first_refresh_seconds until a commit
AGREE_SECONDS = 1.0  # early, faster start: a hypothesis of less is agreed with only from later on
_TIME_SLACK = 0.1  # seconds: token times are approximate (whisper_streaming's margin)


def norm(word: DecodedWord) -> str:
    """A word as agreement compares it: case-folded, letters, digits and apostrophes."""
    return "".join(c for c in word.text.casefold() if c.isalnum() or c == "'")


def agreed_prefix(previous: Sequence[DecodedWord], current: Sequence[DecodedWord]) -> int:
    """How many leading words of ``current`` the ``previous`` hypothesis had, in order."""
    count = 0
    for a, b in zip(previous, current, strict=False):
        if norm(a) != norm(b) or not norm(b):
            break
        count += 1
    return count


def after_committed(
    committed: Sequence[DecodedWord], words: Sequence[DecodedWord]
) -> tuple[DecodedWord, ...]:
    """The words of a decode of the buffer that come after its ``committed`` words.

    ``committed`` are the committed words whose audio is still in the buffer; a decode of the
    buffer hears them again, usually word for word. Matched by text first: the decode's words
    are aligned with them (:mod:`difflib`, ignoring case and punctuation) and the words after
    the last committed one are kept, a committed word heard differently counting as heard.
    When the two do not line up (nothing matches, or the match is far off the diagonal), by
    time: the words that start after the last committed one ends, less a tenth of a second,
    then any leading repeat of the committed words (:func:`~.rolling.drop_repeated_start`).
    """
    words = tuple(words)
    if not committed:
        return words
    ours = [norm(w) for w in committed]
    theirs = [norm(w) for w in words]
    if theirs[: len(ours)] == ours:
        return words[len(ours) :]
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    if blocks:
        last = blocks[-1]
        skip = last.b + last.size + (len(ours) - last.a - last.size)
        matched = sum(b.size for b in blocks)
        if abs(skip - len(ours)) <= 2 + len(ours) // 4 and 2 * matched >= len(ours):
            return words[skip:]
    end = committed[-1].end - _TIME_SLACK
    return drop_repeated_start(committed, tuple(w for w in words if w.start >= end), most=5)


def _capitalized(word: DecodedWord, *others: DecodedWord) -> DecodedWord:
    """``word`` with its first letter's case as ``others`` (the hypotheses that agreed on it)
    all have it. Capitals follow what comes before a word, which every hypothesis heard alike;
    its letters and punctuation stay the newest hypothesis's (they follow what comes after
    it, which the newest heard most of)."""
    head, rest = word.text[:1], word.text[1:]
    if all(w.text[:1].isupper() for w in others) and head.islower():
        return replace(word, text=head.upper() + rest)
    if all(w.text[:1].islower() for w in others) and head.isupper():
        return replace(word, text=head.lower() + rest)
    return word


@dataclass(slots=True)
class AgreementRecognition:
    """One open utterance under LocalAgreement-2 (see the module docstring)."""

    decoder: Decoder
    config: RollingConfig
    language: str
    word_timestamps: bool = False
    interim_results: bool = True
    n_audio_ctx: int = 1500  # the model's encoder length (bounds a decode's span)
    prompt: bool = True  # the committed text as Whisper's prompt (measured: on is better)
    trim_seconds: float = TRIM_SECONDS
    early: bool = False  # commit agreed words at every hypothesis (policy "early")
    confident: float = EARLY_CONFIDENCE  # early: what two hypotheses agree on at once
    _audio: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, np.float32))
    _carry: bytes = b""
    _offset: int = 0  # samples trimmed before the buffer
    _heard: int = 0  # samples accepted
    _due: int = 0  # the next hypothesis's grid point in _heard samples (0: one period)
    _undecoded: int = 0  # samples the last hypothesis did not cover
    _committed: list[DecodedWord] = field(default_factory=list)
    _trimmed: int = 0  # committed words whose audio was trimmed (the rest are in the buffer)
    _tail: tuple[DecodedWord, ...] = ()  # the last hypothesis's words after the committed
    _agreed: int = 0  # of them, those the hypothesis before had too
    _prior: tuple[DecodedWord, ...] = ()  # the hypothesis before that one, aligned with it
    _tail_end: float = 0.0  # where the audio the last hypothesis decoded ends (seconds)
    _locked_language: str | None = None
    _sizes: tuple[int, int] = (0, 0)  # buffer samples of the last two hypotheses
    decodes: int = 0  # hypotheses and commits decoded, for tests and benchmarks

    # -- Recognition -----------------------------------------------------------------------

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        samples, self._carry = pcm_samples(self._carry, pcm)
        return self.accept_samples(samples)

    def accept_samples(
        self, samples: npt.NDArray[np.float32], *, refresh: bool = True
    ) -> Sequence[EngineUpdate]:
        """``accept`` for float samples. ``refresh=False`` buffers them without a hypothesis
        (bounding the buffer all the same): the caller knows the utterance ends after them."""
        if samples.size == 0:
            return []
        self._audio = np.concatenate([self._audio, samples])
        self._heard += samples.size
        self._undecoded += samples.size
        period = self._period
        decoded = False
        while self._audio.size > self._span:
            self._force()
            decoded = True
        due = self._heard >= (self._due or period)
        if refresh and self.interim_results and self._undecoded and due:
            self._hypothesis()
            decoded = True
        if not decoded:
            return []
        # Hypotheses keep to a grid of refresh periods, as in :mod:`.rolling`: a backlog is
        # one decode, and one missed point is made up by the next round, never more. The
        # period is the one after this decode (the early policy's first commit ends the
        # shorter one).
        period = self._period
        self._due = max((self._due or period) + period, self._heard // period * period)
        if not self.interim_results:
            return []
        return [
            EnginePartial(
                text=self._text(self._tail),
                words=self._words(self._tail),
                stable=stable_length(self._committed),
            )
        ]

    def finish(self) -> EngineFinal:
        """The committed words and a whole decode of the buffer after them."""
        tail: tuple[DecodedWord, ...] = ()
        if self._audio.size >= MIN_DECODE_SAMPLES:
            timestamps = self.word_timestamps or len(self._committed) > self._trimmed
            words = self._decode(self._audio, timestamps=timestamps, final=True)
            tail = self._fresh(words)
            if not tail and self._tail and len(self._committed) > self._trimmed:
                # Forced into a long prefix, beam search may close a segment right after it
                # and end (its score is mostly the forced words'), though the last hypothesis
                # heard words after them: the whole audio's words then come from a greedy
                # decode, as the hypotheses', which goes on past the prefix.
                words = self._decode(self._audio, timestamps=timestamps, final=False)
                tail = self._fresh(words)
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

    @property
    def _period(self) -> int:
        """Samples between hypotheses: ``first_refresh_seconds`` while the early policy has
        committed nothing of the utterance in its first :data:`FIRST_SECONDS`, then
        ``refresh_seconds``."""
        if self.early and not self._committed and self._heard < FIRST_SECONDS * SAMPLE_RATE:
            return self.config.first_refresh_samples
        return self.config.refresh_samples

    @property
    def _span(self) -> int:
        """The most audio one decode takes."""
        return commit_samples(self.config, n_audio_ctx=self.n_audio_ctx)

    def _decode(
        self, audio: npt.NDArray[np.float32], *, timestamps: bool, final: bool
    ) -> tuple[DecodedWord, ...]:
        prompt = ""
        if self.prompt and self._trimmed:
            text = " ".join(w.text for w in self._committed[: self._trimmed])
            prompt = text[-PROMPT_CHARACTERS:].lstrip()
        language = self._locked_language or self.language
        inside = " ".join(w.text for w in self._committed[self._trimmed :])
        request = DecodeRequest(
            language=language, timestamps=timestamps, final=final, prompt=prompt, prefix=inside
        )
        decoded = self.decoder.decode(audio, request)
        self.decodes += 1
        self._locked_language = language_to_lock(
            self.language, self._locked_language, decoded, samples=audio.size, offset=self._offset
        )
        seconds = self._offset / SAMPLE_RATE
        return tuple(w.shifted(seconds) for w in decoded.words)

    def _fresh(self, words: tuple[DecodedWord, ...]) -> tuple[DecodedWord, ...]:
        """A decode's words after the committed ones."""
        inside = self._committed[self._trimmed :]
        if inside:
            return after_committed(inside, words)
        # The buffer starts after the last committed word, as far as token times tell: a
        # decode may still hear the end of it again ("how much | much there").
        return drop_repeated_start(self._committed, words)

    def _hypothesis(self) -> None:
        words = self._decode(self._audio, timestamps=True, final=False)
        self._undecoded = 0
        fresh = self._fresh(words)
        previous, prior = self._tail, self._prior
        agreed = agreed_prefix(previous, fresh)
        self._prior = previous
        self._tail = fresh
        self._agreed = agreed
        self._tail_end = (self._offset + self._audio.size) / SAMPLE_RATE
        sizes = self._sizes  # of the audio the previous two hypotheses decoded
        self._sizes = (self._audio.size, sizes[0])
        if self.early:
            # Words three hypotheses agree on, and after them those two agree on that both
            # heard with confidence; their audio stays: the end decodes it again.
            two, three = self._witnesses(sizes)
            count = min(agreed, agreed_prefix(prior, fresh)) if three else 0
            if count:
                # Capitalized as the two before heard them: agreement ignores case, but the
                # committed text is forced as every later decode's prefix, and one
                # hypothesis's odd case ("the" opening the utterance where the two before
                # heard "The") led the decodes after it astray (two of them then agreed on
                # the same mishearing, committed).
                self._tail = (
                    *(_capitalized(w, previous[k], prior[k]) for k, w in enumerate(fresh[:count])),
                    *fresh[count:],
                )
            heard = previous if two == 1 else prior
            limit = agreed_prefix(heard, fresh) if two else 0
            count = min(count, limit)
            while count < limit and (
                min(heard[count].probability, fresh[count].probability) >= self.confident
            ):
                count += 1
            self._commit_agreed(context=0.0, most=count)
        trim = min(self.trim_seconds, 2 * self._span / 3 / SAMPLE_RATE)
        if self._audio.size > trim * SAMPLE_RATE:
            context = min(CONTEXT_SECONDS, trim / 3)
            self._commit_agreed(context=context)
            self._trim(before=self._tail_end - context)

    def _witnesses(self, sizes: tuple[int, int]) -> tuple[int, bool]:
        """Which earlier hypothesis the early policy's two-hypothesis rule compares the new
        one with (1: the previous, 2: the one before, 0: none) and whether the three-
        hypothesis rule may count the one before.

        At ``refresh_seconds`` apart, the previous and the one before. During the faster
        start (``first_refresh_seconds``), a hypothesis that decoded less than
        :data:`AGREE_SECONDS` of audio only counts from ``refresh_seconds`` back (less a
        quarter of slack for a late decode): two guesses at the first word of so little
        audio, a quarter of a second apart, agree too easily (docs/engines.md, "The faster
        start").
        """
        if not self.config.first_refresh_seconds:
            return (1 if sizes[0] else 0), bool(sizes[1])
        now, least = self._audio.size, AGREE_SECONDS * SAMPLE_RATE
        period = self.config.refresh_samples

        def counts(size: int, apart: int) -> bool:
            return bool(size) and (size >= least or now - size >= apart * 3 // 4)

        two = 1 if counts(sizes[0], period) else 2 if counts(sizes[1], period) else 0
        return two, counts(sizes[1], 2 * period)

    def _commit_agreed(self, *, context: float, most: int | None = None) -> None:
        """Commit the words the last two hypotheses agreed on (or the first ``most``, which the
        caller found agreed) that end ``context`` seconds (and at least
        :data:`MARGIN_SECONDS`) before the end of the audio."""
        end = min(
            (self._offset + self._audio.size) / SAMPLE_RATE - context,
            self._tail_end - MARGIN_SECONDS,  # a word the hypothesis's audio cut is a guess
        )
        count = self._agreed if most is None else most  # ``most``: agreed, the caller saw
        while count and self._tail[count - 1].end > end:
            count -= 1
        self._committed.extend(self._tail[:count])
        self._tail = self._tail[count:]
        self._prior = self._prior[count:]
        self._agreed = 0

    def _trim(self, before: float | None = None) -> bool:
        """Drop the buffer's audio up to the end of its last committed word (the last that
        ends by ``before``, when given); whether any."""
        count = len(self._committed)
        if before is not None:
            while count > self._trimmed and self._committed[count - 1].end > before:
                count -= 1
        if count == self._trimmed:
            return False
        end = self._committed[count - 1].end
        following = self._committed[count] if count < len(self._committed) else None
        if following is None and self._tail:
            following = self._tail[0]
        if following is not None and following.start > end:
            end = (end + following.start) / 2  # halfway into the pause after it
        cut = round(end * SAMPLE_RATE) - self._offset
        if cut <= 0:
            return False
        cut = min(cut, self._audio.size)
        self._audio = self._audio[cut:]
        self._offset += cut
        self._undecoded = min(self._undecoded, self._audio.size)
        self._trimmed = count
        return True

    def _force(self) -> None:
        """Bound a full buffer: trimmed at its last committed word, else committed by the
        timestamp cut (see the module docstring)."""
        self._commit_agreed(context=0.0)
        if self._trim():
            return
        span = self._span
        window = self._audio[:span]
        start = self._offset / SAMPLE_RATE
        words = self._decode(window, timestamps=True, final=True)
        fresh = self._fresh(words)
        relative = [w.shifted(-start) for w in fresh]
        cut_seconds, count = choose_cut(
            relative, window.size / SAMPLE_RATE, self.config.keep_seconds
        )
        cut = min(window.size, max(1, round(cut_seconds * SAMPLE_RATE)))
        self._committed.extend(fresh[:count])
        self._audio = self._audio[cut:]
        self._offset += cut
        self._trimmed = len(self._committed)
        self._tail = tuple(fresh[count:])
        self._prior = ()
        self._undecoded = self._audio.size

    def _text(self, tail: Sequence[DecodedWord]) -> str:
        return transcript_text(self._committed, tail)

    def _words(self, tail: Sequence[DecodedWord]) -> tuple[Word, ...]:
        return transcript_words(self._committed, tail, timed=self.word_timestamps)
