"""The early policy's first commit under other rules, replayed on recorded hypotheses.

    python bench/whisper_first_rules.py [--threads 2] [--json]

``bench/whisper_first_words.py`` measures the rules in the tree; this asks what other rules
would have done, without a decode per rule. Each of its 50 utterances is streamed once to
``whisper-base-en`` (CTranslate2 int8, ``policy: "early"``, ``first_refresh_seconds`` 0.25,
one 20 ms frame per call) with every commit held back, and the hypotheses of each stream's
first utterance are recorded with the audio each decoded. Until an utterance's first commit
its hypotheses do not depend on the rule (the same audio, no committed prefix), so each rule
is then replayed on the real ``AgreementRecognition`` with the recorded words in place of
the decoder, up to that first commit. Per rule: how long after the end of the utterance's
first word (the endpoint's, in the recording) the first word is stable (p50, p90, max; at
the endpoint when nothing was committed before it), and the utterances whose first commit is
not the start of the endpoint's text (a frozen mishearing), listed with the committed words
and the audio the committing hypothesis heard.

The rules: ``AGREE_SECONDS`` (a hypothesis of less audio is agreed with only by one at least
three quarters of ``refresh_seconds`` later; 0: any two) and ``confident`` (two hypotheses
that agree commit at once the words both heard with this probability or more; above 1:
never, only three hypotheses commit). docs/engines.md, "Other rules for the first commit".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.whisper_first_words import RATE  # noqa: E402
from bench.whisper_first_words import utterances as clips_of  # noqa: E402
from bench.whisper_live import load  # noqa: E402
from bench.whisper_live import utterances as utterances_of  # noqa: E402

RULES = [  # (AGREE_SECONDS, confident)
    (1.0, 0.5),  # the tree's
    (0.75, 0.5),
    (0.5, 0.5),
    (0.0, 0.5),  # the faster start without the 1 s rule
    (0.0, 0.6),
    (0.0, 0.7),
    (0.0, 1.1),
    (1.0, 0.4),
]


class Ended(Exception):
    """The replayed utterance ended before a commit (its endpoint's decode)."""


def record(model: Any, clips: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """Each clip's first utterance: its hypotheses by audio size, and the endpoint's words."""
    from talkies.engines.whisper import agreement
    from talkies.protocol import EngineEndpoint

    recognition = agreement.AgreementRecognition
    decode, commit = recognition._decode, recognition._commit_agreed
    seen: dict[int, dict[int, Any]] = {}

    def recording(self: Any, audio: Any, *, timestamps: bool, final: bool) -> Any:
        words = decode(self, audio, timestamps=timestamps, final=final)
        if not final:
            seen.setdefault(id(self), {})[audio.size] = words
        return words

    def held(self: Any, *, context: float, most: int | None = None) -> None:
        if most is None:  # a trim's commit (10 s in): not the early rules'
            commit(self, context=context, most=most)

    recognition._decode, recognition._commit_agreed = recording, held  # type: ignore[method-assign]
    lead, tail = b"\0" * (RATE // 2 * 2), b"\0" * (RATE * 3 // 2 * 2)  # as whisper_first_words
    out = []
    try:
        for name, clip in clips:
            seen.clear()
            pcm = lead + clip + tail
            rec = utterances_of(model, "early")
            endpoint = None
            for at in range(0, len(pcm), 640):
                for update in rec.accept(pcm[at : at + 640]):
                    if isinstance(update, EngineEndpoint) and endpoint is None:
                        endpoint = update
            final = rec.finish()
            first = endpoint or final
            out.append(
                {
                    "name": name,
                    "pcm": pcm,
                    "hypotheses": next(iter(seen.values()), {}),
                    "words": [w.word for w in first.words],
                    "first_end": first.words[0].end if first.words else None,
                }
            )
    finally:
        recognition._decode, recognition._commit_agreed = decode, commit  # type: ignore[method-assign]
    return out


def replay(model: Any, item: dict[str, Any], agree: float, confident: float) -> dict[str, Any]:
    """The first commit of ``item``'s first utterance under a rule."""
    from talkies.engines.whisper import agreement
    from talkies.protocol import EnginePartial

    recognition = agreement.AgreementRecognition
    decode, least = recognition._decode, agreement.AGREE_SECONDS
    hypotheses: dict[int, Any] = item["hypotheses"]
    state: dict[str, Any] = {}

    def replaying(self: Any, audio: Any, *, timestamps: bool, final: bool) -> Any:
        self.confident = confident
        if final:  # the endpoint: its words are stable with it
            raise Ended
        state["heard"] = audio.size / RATE
        return hypotheses[audio.size]

    recognition._decode = replaying  # type: ignore[method-assign]
    agreement.AGREE_SECONDS = agree
    try:
        rec = utterances_of(model, "early")
        pcm = item["pcm"]
        for at in range(0, len(pcm), 640):
            now = (at + 640) / 2 / RATE
            try:
                updates = rec.accept(pcm[at : at + 640])
            except Ended:
                return {"at": now, "stable": [], "heard": None}
            for update in updates:
                if isinstance(update, EnginePartial) and update.stable:
                    stable = update.text[: update.stable].split()
                    return {"at": now, "stable": stable, "heard": state["heard"]}
    finally:
        recognition._decode = decode  # type: ignore[method-assign]
        agreement.AGREE_SECONDS = least
    return {"at": None, "stable": [], "heard": None}


def norm(word: str) -> str:
    return "".join(c for c in word.casefold() if c.isalnum() or c == "'")


def evaluate(model: Any, items: list[dict[str, Any]], agree: float, conf: float) -> dict[str, Any]:
    delays: list[float] = []
    wrong = []
    ended = 0
    for item in items:
        if item["first_end"] is None:
            continue
        got = replay(model, item, agree, conf)
        if got["at"] is None:
            raise RuntimeError(f"{item['name']}: neither a commit nor an endpoint")
        delays.append(got["at"] - item["first_end"])
        if got["heard"] is None:  # nothing committed before the endpoint
            ended += 1
            continue
        stable = [norm(w) for w in got["stable"]]
        truth = [norm(w) for w in item["words"][: len(stable)]]
        if stable != truth:
            wrong.append(
                {
                    "utterance": item["name"],
                    "committed": " ".join(got["stable"]),
                    "endpoint": " ".join(item["words"][: len(stable) + 1]),
                    "heard_s": round(got["heard"], 2),
                }
            )
    ordered = sorted(delays)
    return {
        "agree_seconds": agree,
        "confident": conf,
        "committed_early": len(ordered) - ended,
        "first_word_p50": round(ordered[len(ordered) // 2], 2),
        "first_word_p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "first_word_max": round(ordered[-1], 2),
        "wrong": wrong,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clips = clips_of(Path(tmp))
        model = load(Path(tmp) / "model", "ct2", threads=args.threads)
        try:
            items = record(model, clips)
            rows = [evaluate(model, items, agree, conf) for agree, conf in RULES]
        finally:
            model.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(
            f"AGREE_SECONDS {row['agree_seconds']}, confident {row['confident']}: first word"
            f" stable p50 {row['first_word_p50']:.2f} s p90 {row['first_word_p90']:.2f} s max"
            f" {row['first_word_max']:.2f} s ({row['committed_early']} committed before their"
            f" end); first commit wrong in {len(row['wrong'])}"
        )
        for item in row["wrong"]:
            print(
                f"    {item['utterance']}: {item['committed']!r} for {item['endpoint']!r}"
                f" (heard {item['heard_s']} s)"
            )


if __name__ == "__main__":
    main()
