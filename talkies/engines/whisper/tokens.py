"""Whisper's vocabulary as a faster-whisper (CTranslate2) folder ships it: token ids by name,
the special tokens, token bytes, and a prompt's tokens.

The folders carry the vocabulary (``vocabulary.txt`` or ``.json``, or ``tokenizer.json``) but
not always BPE merges, so a prompt is tokenized by greedy longest match over the vocabulary's
byte strings (:meth:`Vocabulary.encode`): every id is a real token and the bytes are the
prompt's, though not always the split BPE would make; a prompt only conditions the decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .ct2 import Ct2FormatError, read_vocabulary
from .ct2ggml import byte_decoder

__all__ = ["MAX_TEXT_CTX", "Vocabulary", "max_length"]

MAX_TEXT_CTX = 448  # Whisper's decoder positions
_MAX_TOKEN_BYTES = 128  # the longest byte string greedy matching tries


def max_length(prompt: Sequence[int], steps: int) -> int:
    """CTranslate2's ``max_length`` for a Whisper decode of up to ``steps`` tokens after
    ``prompt`` (its <|startofprev|> text and start-of-transcript sequence).

    CTranslate2 counts the prompt in it: it decodes at most ``min(max_length / 2, max_length
    - (len(prompt) - 1))`` steps, forced text tokens included (``WhisperReplica::generate``),
    so ``steps`` alone would halve a decode's room, and none at all is left once the prompt
    is half of it. Whisper's 448 positions bound the whole.
    """
    return min(MAX_TEXT_CTX, max(2 * steps, len(prompt) - 1 + steps))


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Token strings by id and the ids a decode needs."""

    tokens: tuple[str, ...]
    ids: dict[str, int]
    eot: int  # <|endoftext|>: text tokens are below it
    sot: int  # <|startoftranscript|>
    transcribe: int
    sot_prev: int  # <|startofprev|>: a prompt follows
    no_timestamps: int
    timestamp_begin: int  # <|0.00|>; every id from here on is a timestamp (20 ms each)
    token_bytes: tuple[bytes, ...]  # the text tokens' bytes (ids below eot)
    by_bytes: dict[bytes, int]  # the inverse, for prompts (the first id of equal bytes)

    @classmethod
    def read(cls, folder: Path) -> Vocabulary:
        tokens = tuple(read_vocabulary(folder))
        ids: dict[str, int] = {}
        for index, token in enumerate(tokens):
            ids.setdefault(token, index)

        def special(*names: str) -> int:
            for name in names:
                if name in ids:
                    return ids[name]
            raise Ct2FormatError(f"{folder}: the vocabulary has no {names[0]}")

        eot = special("<|endoftext|>")
        no_timestamps = special("<|notimestamps|>")
        decoder = byte_decoder()
        pieces: list[bytes] = []
        for token in tokens[:eot]:
            try:
                pieces.append(bytes(decoder[c] for c in token))
            except KeyError:
                pieces.append(token.encode("utf-8"))  # not byte-level text: as it reads
        by_bytes: dict[bytes, int] = {}
        for index, piece in enumerate(pieces):
            if piece:
                by_bytes.setdefault(piece, index)
        return cls(
            tokens=tokens,
            ids=ids,
            eot=eot,
            sot=special("<|startoftranscript|>"),
            transcribe=special("<|transcribe|>"),
            sot_prev=special("<|startofprev|>"),
            no_timestamps=no_timestamps,
            timestamp_begin=no_timestamps + 1,
            token_bytes=tuple(pieces),
            by_bytes=by_bytes,
        )

    def language_token(self, code: str) -> int | None:
        """The id of ``<|code|>``, or None when the vocabulary has no such language."""
        return self.ids.get(f"<|{code}|>")

    def start(self, language: str | None) -> list[int]:
        """The start of a transcript: ``<|startoftranscript|>`` then, on a multilingual
        model, the language and ``<|transcribe|>`` (timestamps on: no ``<|notimestamps|>``)."""
        if language is None:
            return [self.sot]
        token = self.language_token(language)
        if token is None:
            raise ValueError(f"no language token for {language!r}")
        return [self.sot, token, self.transcribe]

    def piece(self, token: int) -> bytes:
        """A text token's bytes (b"" for specials and timestamps)."""
        return self.token_bytes[token] if 0 <= token < self.eot else b""

    def text(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def encode(self, text: str) -> list[int]:
        """``text`` as text tokens, by greedy longest match (see the module docstring)."""
        lookup = self.by_bytes
        data = text.encode("utf-8")
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for end in range(min(len(data), pos + _MAX_TOKEN_BYTES), pos, -1):
                token = lookup.get(data[pos:end])
                if token is not None:
                    out.append(token)
                    pos = end
                    break
            else:
                pos += 1  # a byte no token spells (cannot happen with byte-level BPE)
        return out

    def prompt_text(self, text: str | None) -> list[int]:
        """A prompt's tokens, at most what Whisper's prompt holds (half the context, less
        <|startofprev|>); none for no text."""
        if not text or not text.strip():
            return []
        return self.encode(" " + text.strip())[-(MAX_TEXT_CTX // 2 - 1) :]

    def prompted(self, text: list[int], start: list[int]) -> list[int]:
        """The decoder's prompt: ``text`` after <|startofprev|> when there is any, then the
        start-of-transcript sequence."""
        return [self.sot_prev, *text, *start] if text else start
