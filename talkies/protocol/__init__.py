"""The live-ASR contract as a pure, sans-IO state machine (spec: ``shared/spec/streaming.md``).

Nothing here does I/O, reads a clock or the environment, spawns a thread or logs. A driver
feeds a :class:`StreamSession` inputs with the current time and executes the actions it pulls:

    session = StreamSession(SessionLimits(), now=clock())
    session.handle(TextReceived(data=start_json), now=clock())
    for action in session.pull_actions():
        ...  # Open -> resolve the model, then session.handle(EngineOpened(), now=...)
"""

from .actions import Action, Close, Cut, Feed, Flush, Open, Release, Send
from .errors import CloseCode, ErrorCode, ProtocolError
from .events import (
    CHANNELS,
    ENCODING,
    SAMPLE_RATE,
    Endpoint,
    Error,
    Event,
    Final,
    Partial,
    Ready,
    Stats,
    TranscriptEvent,
    Word,
)
from .inputs import (
    AudioBatch,
    AuthRejected,
    BinaryReceived,
    CutRequested,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Input,
    PeerGone,
    Refused,
    ShuttingDown,
    TextReceived,
    Tick,
)
from .lag import LagRecord, LagSummary
from .messages import MAX_CONTROL_BYTES, MODEL_SLUG, StartOptions
from .session import SessionLimits, StreamSession
from .table import TABLE, Handler, InputKind, Rule, State

__all__ = [
    "CHANNELS",
    "ENCODING",
    "MAX_CONTROL_BYTES",
    "MODEL_SLUG",
    "SAMPLE_RATE",
    "TABLE",
    "Action",
    "AudioBatch",
    "AuthRejected",
    "BinaryReceived",
    "Close",
    "CloseCode",
    "Cut",
    "CutRequested",
    "Endpoint",
    "EngineEndpoint",
    "EngineFailed",
    "EngineFinal",
    "EngineOpened",
    "EnginePartial",
    "Error",
    "ErrorCode",
    "Event",
    "Feed",
    "Final",
    "Flush",
    "Handler",
    "Input",
    "InputKind",
    "LagRecord",
    "LagSummary",
    "Open",
    "Partial",
    "PeerGone",
    "ProtocolError",
    "Ready",
    "Refused",
    "Release",
    "Rule",
    "Send",
    "SessionLimits",
    "ShuttingDown",
    "StartOptions",
    "State",
    "Stats",
    "StreamSession",
    "TextReceived",
    "Tick",
    "TranscriptEvent",
    "Word",
]
