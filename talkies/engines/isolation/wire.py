"""The messages between the server and an engine process (:mod:`talkies.engines.isolation`).

Every message is a pickled tuple on a :mod:`multiprocessing.connection`, authenticated both
ways. A reply is ``("ok", value)`` or one of the failures :func:`reply_for` writes and
:func:`value_of` raises again on the server's side, so an engine's refusal, a cancelled
transcription and a speech error cross the process boundary as themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from ..base import Refusal, RefusalKind, TranscriptionCancelled
from ..tts.base import SpeechError, SynthesisFailed

__all__ = ["HELLO", "WIRE_CHUNK_BYTES", "reply_for", "requests", "send", "value_of"]

log = logging.getLogger("talkies.engines")

HELLO = "TALKIES-ENGINE "  # the prefix of the child's one line on stdout
# The most PCM one message of a file transcription carries (2 s): a transcription's audio
# crosses as many such messages, so neither side ever holds the file whole.
WIRE_CHUNK_BYTES = 64_000


def value_of(reply: tuple[Any, ...]) -> Any:
    """The value of a reply, or the child's exception raised again here."""
    kind = reply[0]
    if kind == "ok":
        return reply[1]
    if kind == "refusal":
        raise Refusal(RefusalKind(reply[1]), reply[2], field=reply[3])
    if kind == "cancelled":
        raise TranscriptionCancelled(reply[1])
    if kind == "speech_error":
        raise SpeechError(RefusalKind(reply[1]), reply[2], param=reply[3])
    raise RuntimeError(reply[1])


def reply_for(exc: Exception) -> tuple[Any, ...]:
    """The reply for what a model call raised in the child (the other side of
    :func:`value_of`); an unexpected exception is logged there."""
    if isinstance(exc, SpeechError):
        return ("speech_error", exc.kind.value, exc.detail, exc.field)
    if isinstance(exc, Refusal):
        return ("refusal", exc.kind.value, exc.detail, exc.field)
    if isinstance(exc, TranscriptionCancelled):
        return ("cancelled", str(exc))
    if not isinstance(exc, SynthesisFailed):  # that one was logged where it was raised
        log.exception("engine call failed")
    return ("error", f"{type(exc).__name__}: {exc}")


def requests(conn: Connection) -> Iterator[tuple[Any, ...]]:
    """The server's requests on ``conn``, until it closes the connection."""
    while True:
        try:
            yield conn.recv()
        except (EOFError, OSError):
            return


def send(conn: Connection, reply: tuple[Any, ...]) -> bool:
    """Send ``reply``; False when the other end is gone."""
    try:
        conn.send(reply)
    except OSError:
        return False
    return True
