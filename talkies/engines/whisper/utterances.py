"""A live Whisper stream cut into utterances by voice activity detection.

The stream's audio goes through :class:`~talkies.engines.runtime.vad.VoiceActivity` first:

- **Silence is not decoded.** Outside speech only the last ``vad_speech_pad_seconds`` are
  kept (the lead-in of the next utterance); nothing is given to Whisper.
- **An utterance** starts where speech starts, padded; its audio goes to a
  :class:`~.rolling.WhisperRecognition` of its own (the timestamp cut: speech longer than one
  decode holds is committed at the window's overflow), whose partials (its committed words
  and the rolling hypothesis of the rest) are the stream's partials, word times shifted to
  stream time. ``policy="agreement"`` gives it LocalAgreement-2 instead
  (:class:`~.agreement.AgreementRecognition`, with the committed text as prompt), which
  measured worse on long speech (docs/engines.md, "Long speech"); benchmarks select it.
  ``policy="early"`` (entry option ``policy``) is LocalAgreement-2 committing agreed words
  at every hypothesis, a second or so after they were said. The policy comes from the
  entry's options unless the caller names one.
- **Stable text.** Every partial says how much of it is committed (``stable``: the length
  of its committed words' text, which the endpoint or the final begins with exactly); under
  the timestamp cut that is nothing until an utterance outgrows one decode (about 15 s),
  under "early" the words agreed on so far.
- **At a pause** (``vad_min_silence_seconds`` under the threshold) the utterance is decoded
  whole once, with the longer encoder (the recognition's ``finish``), and sent as an
  ``endpoint`` event: the protocol's utterance boundary, as Vosk and Sherpa send theirs.
  Words committed within the utterance are never revised, so its endpoint begins with every
  one of them. An utterance with less than ``vad_min_speech_seconds`` of speech (a click)
  ends with an empty endpoint, undecoded: it withdraws any partial it showed (unless it
  committed words: then it is decoded, to keep the promise).
- **The final** (``end``) is the whole decode of the open utterance (empty when none is
  open), the audio after the last endpoint, as the contract says.

Audio that arrives in one batch is split at the detector's boundaries, so a backlog is
handled exactly as the same audio in 20 ms frames: an utterance that ends within the batch
is buffered and decoded once, with no hypothesis decode of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from ...protocol import EngineEndpoint, EngineFinal, EnginePartial, Word
from ...protocol.events import SAMPLE_RATE
from ..base import EngineUpdate
from ..runtime.vad import SpeechEnd, SpeechStart, VoiceActivity
from .agreement import AgreementRecognition
from .config import POLICIES, RollingConfig, commit_samples
from .rolling import Decoder, WhisperRecognition, pcm_samples

__all__ = ["POLICIES", "UtteranceRecognition"]


def _shifted(words: Sequence[Word], seconds: float) -> tuple[Word, ...]:
    return tuple(replace(w, start=w.start + seconds, end=w.end + seconds) for w in words)


class UtteranceRecognition:
    """One live stream: VAD-cut utterances, each rolled and then decoded whole."""

    def __init__(
        self,
        decoder: Decoder,
        config: RollingConfig,
        activity: VoiceActivity,
        *,
        language: str,
        word_timestamps: bool = False,
        interim_results: bool = True,
        n_audio_ctx: int = 1500,
        policy: str | None = None,
        prompt: bool = True,
    ) -> None:
        policy = config.policy if policy is None else policy
        if policy not in POLICIES:
            raise ValueError(f"unknown commit policy {policy!r}")
        self.policy = policy
        self.prompt = prompt
        self.decoder = decoder
        self.config = config
        self.activity = activity
        self.language = language
        self.word_timestamps = word_timestamps
        self.interim_results = interim_results
        self.n_audio_ctx = n_audio_ctx
        self._carry = b""
        self._heard = 0  # samples accepted
        self._recent = np.zeros(0, np.float32)  # the last samples heard, for the lead-in
        self._keep = activity.config.pad_samples + 2 * 1024
        self._open: AgreementRecognition | WhisperRecognition | None = None
        self._open_start = 0  # first sample of the open utterance
        self._fed = 0  # samples given to the open utterance (up to this stream position)
        self._language_found: str | None = None  # an "auto" stream's language, once known
        # An utterance is decoded whole up to what the longer encoder takes (about 15 s), so
        # that its endpoint is one decode of all of it; longer speech is trimmed at committed
        # words (agreement) or committed at the window's overflow (timestamp).
        span = commit_samples(config, n_audio_ctx=n_audio_ctx) / SAMPLE_RATE
        self._utterance_config = replace(config, window_seconds=max(config.window_seconds, span))
        self.utterances = 0  # decoded and ended, for tests and benchmarks

    # -- Recognition -------------------------------------------------------------------------

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        samples, self._carry = pcm_samples(self._carry, pcm)
        if samples.size == 0:
            return []
        base = self._heard - self._recent.size  # stream position of audio[0]
        audio = np.concatenate([self._recent, samples])
        self._heard += samples.size
        updates: list[EngineUpdate] = []
        for event in self.activity.push(samples):
            if isinstance(event, SpeechStart):
                self._begin(event.start)
                self._feed(audio, base, event.at, refresh=False, into=updates)
            elif self._open is not None:
                assert isinstance(event, SpeechEnd)
                self._feed(audio, base, event.at, refresh=False, into=updates)
                updates.append(self._end(event))
        if self._open is not None:
            self._feed(audio, base, self._heard, refresh=True, into=updates)
        self._recent = audio[-self._keep :].copy()
        return updates

    def finish(self) -> EngineFinal:
        if self._open is None:
            return EngineFinal(text="")
        utterance, start = self._open, self._open_start
        self._open = None
        try:
            final = utterance.finish()
        finally:
            utterance.close()
        self.utterances += 1
        return EngineFinal(text=final.text, words=_shifted(final.words, start / SAMPLE_RATE))

    def close(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    # -- introspection (tests, benchmarks) ---------------------------------------------------

    @property
    def in_utterance(self) -> bool:
        return self._open is not None

    @property
    def open_committed_text(self) -> str:
        """The open utterance's committed words (never revised); "" between utterances."""
        return self._open.committed_text if self._open is not None else ""

    # -- internals ---------------------------------------------------------------------------

    def _begin(self, start: int) -> None:
        if self._open is not None:  # cannot happen: the detector alternates
            self._open.close()
        language = self.language
        if language == "auto" and self._language_found:
            language = self._language_found
        if self.policy in ("agreement", "early"):
            self._open = AgreementRecognition(
                self.decoder,
                self._utterance_config,
                language=language,
                word_timestamps=self.word_timestamps,
                interim_results=self.interim_results,
                n_audio_ctx=self.n_audio_ctx,
                prompt=self.prompt,
                early=self.policy == "early",
            )
        else:
            self._open = WhisperRecognition(
                self.decoder,
                self._utterance_config,
                language=language,
                word_timestamps=self.word_timestamps,
                interim_results=self.interim_results,
                n_audio_ctx=self.n_audio_ctx,
            )
        self._open_start = start
        self._fed = start

    def _feed(
        self,
        audio: npt.NDArray[np.float32],
        base: int,
        until: int,
        *,
        refresh: bool,
        into: list[EngineUpdate],
    ) -> None:
        """Give the open utterance the audio from where it stopped to ``until``."""
        assert self._open is not None
        first = max(self._fed, base)
        if until <= first:
            return
        chunk = audio[first - base : until - base]
        self._fed = until
        seconds = self._open_start / SAMPLE_RATE
        for update in self._open.accept_samples(chunk, refresh=refresh):
            if isinstance(update, EnginePartial):
                into.append(replace(update, words=_shifted(update.words, seconds)))

    def _end(self, event: SpeechEnd) -> EngineEndpoint:
        assert self._open is not None
        utterance, start = self._open, self._open_start
        self._open = None
        try:
            if event.short and not utterance.committed_text:
                return EngineEndpoint(text="")  # a click: withdraws what it showed
            final = utterance.finish()
            self._language_found = self._language_found or utterance.language_found
        finally:
            utterance.close()
        self.utterances += 1
        return EngineEndpoint(text=final.text, words=_shifted(final.words, start / SAMPLE_RATE))
