"""What the two dialects' in-memory pairs and fuzz harnesses share.

:class:`DialectPair` is what the app does around a dialect's translator and the native
session, minus the sockets: client reads through the translator's ``client`` into the
session, every ``Send`` of the session back through its ``session``, an engine opened on
``Open``, the translator told on ``Close``. fuzz/_listen.py (Deepgram) and fuzz/_realtime.py
(OpenAI Realtime) each add how a connection starts and their oracle of a message's shape.

:class:`Program` reads the ops both harnesses (fuzz/fuzz_listen.py, fuzz/fuzz_realtime.py)
share, with the same codes, from the fuzz bytes, and :func:`main` is the rest of a harness
around its ``check_one``. A harness imports this module inside its atheris instrumentation,
as it does the dialects: atheris instruments all of ``talkies`` imported there, the session
too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fuzz import _harness
from talkies.protocol import (
    Close,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    Input,
    Open,
    PeerGone,
    Refused,
    Send,
    SessionLimits,
    State,
    StreamSession,
    TextReceived,
    Tick,
    Word,
)

__all__ = [
    "DIALECT_LIMITS",
    "ERROR_CODES",
    "DialectPair",
    "Program",
    "main",
    "program",
]

DIALECT_LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=30.0,
    idle_timeout_seconds=10.0,
    start_timeout_seconds=5.0,
)
ERROR_CODES = {code.value for code in ErrorCode}


class _Translator(Protocol):
    def client(self, batch: list[Any], /) -> list[Input]: ...
    def session(self, text: str, /) -> None: ...
    def closing(self) -> None: ...
    def pull_messages(self) -> list[str]: ...


@dataclass(kw_only=True)
class DialectPair:
    """A translator and a session, driven like one connection. A subclass sets
    ``translator`` and ``session`` (:meth:`_new_session`) and takes each message the
    translator says (:meth:`_received`)."""

    now: float = 0.0
    close_code: int | None = None
    opened: bool = False  # the session asked for an engine stream
    translator: _Translator = field(init=False, repr=False)
    session: StreamSession = field(init=False, repr=False)

    def _new_session(self) -> StreamSession:
        return StreamSession(DIALECT_LIMITS, now=self.now)

    @property
    def closed(self) -> bool:
        return self.session.state is State.CLOSED

    def client(self, batch: list[Any]) -> None:
        """One read of client messages, as the channel gives them."""
        inputs = self.translator.client(batch)
        self._collect()
        for item in inputs:
            self._handle(item)
        self._settle()

    def engine(self, item: Input) -> None:
        """An engine answer or a transport fact (EngineOpened, EnginePartial, Tick, ...)."""
        self._handle(item)
        self._settle()

    def finish(self) -> None:
        self._handle(PeerGone())

    def _settle(self) -> None:
        """After each client read or engine input: what the dialect still owes the session."""

    def _handle(self, item: Input) -> None:
        self.session.handle(item, self.now)
        for action in self.session.pull_actions():
            if isinstance(action, Send):
                self.translator.session(action.event.to_json())
                self._collect()
            elif isinstance(action, Open):
                self.opened = True
            elif isinstance(action, Close):
                assert self.close_code is None, "closed twice"
                self.close_code = int(action.code)
                self.translator.closing()

    def _collect(self) -> None:
        for text in self.translator.pull_messages():
            message = json.loads(text)
            assert self.close_code is None, f"{message.get('type')} after the close"
            self._received(message)

    def _received(self, message: dict[str, Any]) -> None:
        raise NotImplementedError


# The harnesses.

_WORD = 0.2  # seconds per fuzzed word


@dataclass
class Program:
    """A harness's program of ops, one byte each, read from the fuzz bytes after the query
    line; :meth:`step` runs the ops both dialects read alike:

    0: EngineOpened; 2, 3: client text of the next byte's length, whole (2) or a fragment (3);
    4, 5, 6: an EnginePartial, EngineEndpoint or EngineFinal of the next byte's count (mod 8)
    of timed words (``untimed``: odd counts of the endpoint and final carry no times);
    7: the clock on by the next byte in tenths of a second, and a Tick; 12: the connection
    limit's refusal; 13: EngineFailed.
    """

    pair: DialectPair
    data: bytes
    untimed: bool = False
    at: int = 0
    utterance: float = 0.0  # where the open utterance's words start
    longest: int = 0

    def byte(self) -> int | None:
        if self.at >= len(self.data):
            return None
        self.at += 1
        return self.data[self.at - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += len(out)
        return out

    def ops(self, most: int, kinds: int) -> Iterator[int]:
        """Up to ``most`` ops, each a byte mod ``kinds``, until the bytes run out."""
        for _ in range(most):
            op = self.byte()
            if op is None:
                return
            yield op % kinds

    def words(self, count: int, timed: bool) -> tuple[str, tuple[Word, ...]]:
        """The open utterance's first ``count`` words (``w0`` ...), 0.2 s each, with times
        when ``timed``."""
        self.longest = max(self.longest, count)
        words = tuple(
            Word(
                word=f"w{i}",
                start=round(self.utterance + i * _WORD, 3),
                end=round(self.utterance + (i + 1) * _WORD, 3),
            )
            for i in range(count)
        )
        return " ".join(w.word for w in words), words if timed else ()

    def next_utterance(self) -> None:
        """The utterance ended: the next one's words come after its longest."""
        self.utterance += (self.longest + 1) * _WORD
        self.longest = 0

    def step(self, op: int) -> bool:
        """Run ``op`` if it is one of the shared ones; False if it is the dialect's own."""
        pair = self.pair
        if op == 0:
            pair.engine(EngineOpened())
        elif op in (2, 3):
            length = self.byte() or 0
            pair.client([TextReceived(data=self.take(length), final=op == 2)])
        elif op in (4, 5, 6):
            count = (self.byte() or 0) % 8
            timed = not self.untimed or count % 2 == 0 or op == 4
            text, words = self.words(count, timed)
            kind = {4: EnginePartial, 5: EngineEndpoint, 6: EngineFinal}[op]
            pair.engine(kind(text=text, words=words))
            if op != 4:
                self.next_utterance()
        elif op == 7:
            pair.now += (self.byte() or 0) / 10
            pair.engine(Tick())
        elif op == 12:
            pair.engine(Refused(code=ErrorCode.CONNECTION_LIMIT, detail="full"))
        elif op == 13:
            pair.engine(EngineFailed(detail="engine failed"))
        else:
            return False
        return True


def program(*ops: int | bytes) -> bytes:
    """A seed's program: op codes and the bytes they read."""
    return b"".join(bytes([op]) if isinstance(op, int) else op for op in ops)


def main(
    argv: list[str],
    atheris: Any,
    check: Callable[[bytes], object],
    seeds: dict[str, bytes],
    corpus: Path,
) -> None:
    """``--write-seeds`` checks each seed and writes it to ``corpus``; anything else is
    libFuzzer's command line (fuzz/_harness.py)."""
    if argv[1:] == ["--write-seeds"]:
        corpus.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            check(data)
            (corpus / name).write_bytes(data)
        return
    _harness.main(argv, atheris, check)
