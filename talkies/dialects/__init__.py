"""Other clients' wire protocols as pure, sans-IO translators over the native session.

Each module turns one protocol's client messages into :class:`~talkies.protocol.StreamSession`
inputs and the session's events into that protocol's messages. Like ``talkies/protocol``,
nothing here does I/O, reads a clock, draws random numbers, spawns a thread, touches the
environment or logs (the purity test is in ``tests/test_dialect_deepgram_translator.py``): the
request id and the creation time a protocol needs are handed in by the app layer
(``talkies/app/dialects.py``, ``talkies/app/realtime.py``), which also runs the translator over
the same driver, admission, slots and limits as the native route. ``common`` holds what both
write alike.
"""

from .deepgram import LISTEN_PATH, ListenError, ListenOptions, ListenTranslator, parse_listen_query
from .realtime import REALTIME_PATH, RealtimeConfig, RealtimeTranslator, parse_realtime_query

__all__ = [
    "LISTEN_PATH",
    "REALTIME_PATH",
    "ListenError",
    "ListenOptions",
    "ListenTranslator",
    "RealtimeConfig",
    "RealtimeTranslator",
    "parse_listen_query",
    "parse_realtime_query",
]
