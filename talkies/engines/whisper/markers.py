"""Whisper's non-speech annotations: what it writes for silence, music and noise
("[BLANK_AUDIO]", "[Music]", "(wind blowing)", "*laughs*"). Nobody said them, so they are
neither words nor text of a transcript; a decode of silence then yields no words at all,
which is what a client of the spec expects."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["speech_mask", "strip_markers"]

_PAIRS = {"[": "]", "(": ")", "*": "*"}
_MARKER = re.compile(r"\s*(\[[^\[\]]*\]|\([^()]*\)|\*[^*\s][^*]*\*)\s*")


def speech_mask(words: Sequence[str]) -> list[bool]:
    """For each word, whether it is speech: False for every word of a bracketed annotation,
    which may span words ("[ Silence ]", "(wind blowing)"). An opening bracket that is never
    closed marks nothing, so a stray "(" cannot swallow the rest of a transcript."""
    keep = [True] * len(words)
    index = 0
    while index < len(words):
        word = words[index].strip()
        closing = _PAIRS.get(word[:1])
        if closing is not None:
            for end in range(index, len(words)):
                tail = words[end].strip()
                if (end > index or len(word) > 1) and tail.endswith(closing):
                    for k in range(index, end + 1):
                        keep[k] = False
                    index = end
                    break
        index += 1
    return keep


def strip_markers(text: str) -> str:
    """``text`` without its annotations, spaces collapsed around where they were."""
    return re.sub(r"\s{2,}", " ", _MARKER.sub(" ", text)).strip()
