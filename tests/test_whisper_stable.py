"""What a live Whisper stream promises with ``stable``, and that its endpoints keep it.

A partial's ``stable`` is the length of its committed words' text: the utterance's endpoint
(or the final, when the stream ends first) begins with exactly ``text[:stable]``. Checked over
any framing of the audio, for each commit policy, with the scripted decoder of
``test_engine_whisper`` and with a fickle one that hears the utterance differently at its end
and ignores the forced prefix (as whisper.cpp does): the promise holds by construction, not
because the decoder agrees with itself. The real model (CTranslate2 base) is checked in
``test_whisper_ct2``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.runtime.vad import VadConfig, VoiceActivity
from talkies.engines.whisper import Decoded, DecodeRequest, RollingConfig, resolve_config
from talkies.engines.whisper.config import POLICIES
from talkies.engines.whisper.utterances import UtteranceRecognition
from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial

from .test_engine_whisper import GAP_SECONDS, WORD_SECONDS, ScriptedDecoder
from .test_whisper_utterances import Loudness, speech

SR = 16000


@dataclass
class FickleDecoder:
    """The scripted decoder, but its whole-utterance decodes (``final``) misread, drop or
    add words, chosen by a seed: a model that changes its mind at the end. Ignores
    ``prefix``, as whisper.cpp does."""

    seed: int
    inner: ScriptedDecoder = field(default_factory=ScriptedDecoder)
    prefixes: list[str] = field(default_factory=list)

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        self.prefixes.append(request.prefix)
        decoded = self.inner.decode(audio, request)
        if not request.final or not decoded.words:
            return decoded
        rng = np.random.default_rng([self.seed, len(self.prefixes)])
        words = list(decoded.words)
        for _ in range(int(rng.integers(1, 3))):
            k = int(rng.integers(0, len(words)))
            action = int(rng.integers(0, 3))
            if action == 0:
                words[k] = replace(words[k], text="x" + words[k].text)
            elif action == 1 and len(words) > 1:
                del words[k]
            else:
                words.insert(k, replace(words[k], text="extra"))
        return Decoded(tuple(words), language=decoded.language)


def recognition(decoder: Any, policy: str, **options: Any) -> UtteranceRecognition:
    config = RollingConfig(**options)
    vad = VadConfig(min_silence_seconds=0.5, speech_pad_seconds=0.1, min_speech_seconds=0.1)
    return UtteranceRecognition(
        decoder,
        config,
        VoiceActivity(Loudness(), vad),
        language="en",
        word_timestamps=True,
        policy=policy,
    )


def check_promises(updates: Sequence[Any], promised: str) -> str:
    """Check a call's updates against the open utterance's promise; the promise after them."""
    for update in updates:
        if isinstance(update, EnginePartial):
            assert update.stable is not None and 0 <= update.stable <= len(update.text)
            kept = update.text[: update.stable]
            assert kept.startswith(promised), (promised, kept)  # never shrinks nor changes
            promised = kept
        else:
            assert isinstance(update, EngineEndpoint | EngineFinal)
            assert update.text.startswith(promised), (promised, update.text)
            promised = ""
    return promised


@settings(max_examples=30, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    fickle=st.integers(-1, 1000),  # -1: the scripted decoder, else a fickle one's seed
    groups=st.lists(st.integers(1, 14), min_size=1, max_size=3),
    cuts=st.lists(st.integers(160, 20000), min_size=1, max_size=40),  # samples
    pause=st.sampled_from([0.6, 1.5]),
    first=st.sampled_from([0.0, 0.25]),  # first_refresh_seconds
)
def test_every_endpoint_begins_with_the_stable_prefix_announced(
    *, policy: str, fickle: int, groups: list[int], cuts: list[int], pause: float, first: float
) -> None:
    pcm, expected = speech(groups, pause)
    decoder: Any = ScriptedDecoder() if fickle < 0 else FickleDecoder(fickle)
    # A 3 s window and a 256-position encoder: utterances over 4.6 s commit at overflow.
    rec = recognition(
        decoder,
        policy,
        window_seconds=3.0,
        keep_seconds=0.75,
        final_audio_ctx=256,
        first_refresh_seconds=first,
    )
    promised = ""
    position = 0
    said: list[str] = []
    for size in itertools.cycle(2 * c for c in cuts):
        if position >= len(pcm):
            break
        updates = rec.accept(pcm[position : position + size])
        promised = check_promises(updates, promised)
        said.extend(u.text for u in updates if isinstance(u, EngineEndpoint) and u.text)
        position += size
    final = rec.finish()
    check_promises([final], promised)
    if fickle < 0:  # a decoder that agrees with itself: every word, once, in order
        assert " ".join([*said, final.text]).strip() == expected


@pytest.mark.parametrize("policy", ["early", "agreement", "timestamp"])
def test_the_early_policy_makes_each_word_stable_within_a_second_of_its_audio(
    policy: str,
) -> None:
    """Positions in the audio, not clocks: the word's end against the audio accepted when the
    first partial whose stable text holds it came."""
    pcm, expected = speech([9], pause=1.0)
    decoder = ScriptedDecoder()
    rec = recognition(decoder, policy)
    stable_at: dict[str, float] = {}
    for i in range(0, len(pcm), 640):
        heard = (i + 640) / 2 / SR
        for update in rec.accept(pcm[i : i + 640]):
            kept = update.text[: update.stable] if isinstance(update, EnginePartial) else ""
            for word in kept.split():
                stable_at.setdefault(word, heard)
    words = expected.split()
    ends = {w: 0.3 + (k + 1) * WORD_SECONDS + k * GAP_SECONDS for k, w in enumerate(words)}
    if policy == "early":
        assert set(stable_at) == set(words[:-1]) or set(stable_at) == set(words)
        assert max(stable_at[w] - ends[w] for w in stable_at) <= 1.0 + 0.021
        assert decoder.final_decodes == 1  # still one decode of the whole utterance
        # The committed words in the buffer were forced as the decoder's prefix.
        assert any(r.prefix for _, r in decoder.requests)
    else:  # these commit only when the utterance outgrows one decode
        assert stable_at == {}


def test_the_fickle_decoder_keeps_the_promise_at_a_cost() -> None:
    """Whatever the end's decode says, the endpoint is the committed words and what follows
    them; the promise holds (the transcript may differ from the end's decode)."""
    pcm, _ = speech([9], pause=1.0)
    for seed in range(20):
        rec = recognition(FickleDecoder(seed), "early")
        promised = ""
        for i in range(0, len(pcm), 640):
            promised = check_promises(rec.accept(pcm[i : i + 640]), promised)
        check_promises([rec.finish()], promised)


def test_the_policy_is_an_entry_option() -> None:
    assert resolve_config({}).policy == "timestamp"
    assert resolve_config({"policy": "early"}).policy == "early"
    with pytest.raises(ValueError, match="policy"):
        resolve_config({"policy": "eager"})
    rec = UtteranceRecognition(
        ScriptedDecoder(),
        RollingConfig(policy="early"),
        VoiceActivity(Loudness(), VadConfig()),
        language="en",
    )
    assert rec.policy == "early"
