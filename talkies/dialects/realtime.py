"""OpenAI Realtime transcription, ``GET /v1/realtime?intent=transcription``, translated.

OpenAI's realtime clients (the ``openai`` SDKs' ``client.realtime.connect``, LiveKit's and
pipecat's OpenAI STT) open a WebSocket, get ``session.created``, configure the session with
``session.update`` (GA) or ``transcription_session.update`` (beta), stream base64 PCM16 at
24 kHz in ``input_audio_buffer.append`` events, and read items back: the server's voice
detection opens and closes each one (``input_audio_buffer.speech_started`` ... ``.committed``),
and its transcript comes as append-only ``delta`` events and a ``completed`` one. This module
is the whole translation, pure and sans-IO (docs/dialects.md has the table of every event both
ways; ``tests/test_dialect_realtime_table.py`` runs it):

- :func:`parse_realtime_query` checks the upgrade's query (``intent=transcription``, an
  optional Talkies ``model``; nothing else, credentials least of all);
- :func:`configure` applies a ``session`` object (either dialect) to a
  :class:`RealtimeConfig`, or says why not as an :class:`EventError` (OpenAI's ``error``
  event; the session goes on);
- :class:`RealtimeTranslator` turns client events into native inputs
  (:meth:`~RealtimeTranslator.client`) and native events into OpenAI events
  (:meth:`~RealtimeTranslator.session`), pulled with :meth:`~RealtimeTranslator.pull_messages`.
  The native stream is opened (its ``start``) by the first session update or the first
  append, whichever comes first; audio is held until the native ``ready``.

With server VAD (the default), items follow the engine's endpoints (Vosk's, Whisper's VAD).
An item's ``delta`` events carry only text that will not be revised: the prefix of each
partial the engine marks ``stable`` (Whisper), as it grows, and the rest at the endpoint, so
the deltas of an item add up to exactly its ``completed`` text. Engines that promise no
prefix (Vosk, sherpa) give one delta, at the endpoint.

Manual commits (``turn_detection: null``): the client's ``input_audio_buffer.commit`` is the
native :class:`~talkies.protocol.CutRequested` (the engine closes the utterance there and
goes on, in the same stream and slot); the item is ``committed`` at once and its transcript
(the engine's own endpoints since the last commit, then the cut's) comes with the cut's
answer. A commit under server VAD cuts the open utterance the same way, ending its item.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl

from ..protocol import (
    MAX_CONTROL_BYTES,
    MODEL_SLUG,
    AudioBatch,
    BinaryReceived,
    CutRequested,
    ErrorCode,
    TextReceived,
)
from .common import DUMPS, ClientInput, native_start, quote

__all__ = [
    "CLIENT_SECRETS_PATH",
    "INPUT_RATE",
    "LOGPROBS",
    "REALTIME_PATH",
    "ClientInput",
    "EventError",
    "QueryError",
    "RealtimeConfig",
    "RealtimeQuery",
    "RealtimeTranslator",
    "configure",
    "error_event",
    "event_limit",
    "parse_realtime_query",
    "session_object",
]

REALTIME_PATH = "/v1/realtime"
CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
INPUT_RATE = 24000  # the only PCM rate a Realtime session takes; resampled to 16 kHz by app/
LOGPROBS = "item.input_audio_transcription.logprobs"


_MAX_QUERY_FIELDS = 16
_SERVER_VAD_DEFAULTS: dict[str, Any] = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
}
# server_vad's tuning: accepted and echoed, the pause that ends an item is the engine's rule.
_SERVER_VAD_KEYS = frozenset(
    {
        "type",
        "threshold",
        "prefix_padding_ms",
        "silence_duration_ms",
        "idle_timeout_ms",
        "create_response",
        "interrupt_response",
    }
)
# Client events of a conversation session: known, not served on a transcription session.
_CONVERSATION_EVENTS = frozenset(
    {
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)
_MIN_COMMIT_BYTES = 2 * INPUT_RATE // 10  # 100 ms at 24 kHz: less is an empty buffer
# The scanner json.loads ends in (the C one where CPython has it): an object that fills the
# whole string is read by it directly, without json.loads' two layers of Python calls and
# its two whitespace matches; anything else (whitespace around, extra data) goes to
# json.loads, which gives the same value or the same error.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def event_limit(max_frame_bytes: int) -> int:
    """The largest client event read (bytes of JSON text): an append carrying one frame of
    the native limit's size of 24 kHz audio, base64-encoded, and room for its envelope."""
    return 4 * (max_frame_bytes // 3 + 1) + MAX_CONTROL_BYTES


class QueryError(Exception):
    """An upgrade query Talkies will not serve: the native code (its close code), why."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True, kw_only=True, slots=True)
class EventError(Exception):
    """A client event refused with OpenAI's ``error`` event; the session goes on."""

    code: str
    message: str
    param: str | None = None
    type: str = "invalid_request_error"


@dataclass(frozen=True, kw_only=True, slots=True)
class RealtimeQuery:
    model: str  # the session's model until a session update names another


@dataclass(frozen=True, kw_only=True, slots=True)
class RealtimeConfig:
    """A transcription session's settings (docs/dialects.md says what each does here)."""

    model: str
    language: str | None = None
    prompt: str = ""
    # None: manual commits only (turn_detection null)
    turn_detection: dict[str, Any] | None = field(
        default_factory=lambda: dict(_SERVER_VAD_DEFAULTS)
    )
    include: tuple[str, ...] = ()

    def start_message(self) -> str:
        """The native ``start`` this session opens (words and partials always: the
        speech_started event and the cut of a clear need them)."""
        return native_start(self.model, self.language)


def parse_realtime_query(query: bytes | str, *, default_model: str) -> RealtimeQuery:
    """Validate a ``/v1/realtime`` upgrade query; raise :class:`QueryError`."""
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    try:
        pairs = parse_qsl(
            query, keep_blank_values=True, max_num_fields=_MAX_QUERY_FIELDS, errors="replace"
        )
    except ValueError:
        raise QueryError(
            ErrorCode.INVALID_FIELD, f"more than {_MAX_QUERY_FIELDS} query parameters"
        ) from None
    values: dict[str, str] = {}
    for name, value in pairs:
        if name in values:
            raise QueryError(ErrorCode.DUPLICATE_FIELD, f"{quote(name)} is given twice")
        if name not in ("intent", "model"):
            # api_key, token, key ...: credentials never travel in a URL here.
            raise QueryError(
                ErrorCode.UNKNOWN_FIELD, f"the query parameter {quote(name)} is not supported"
            )
        values[name] = value
    intent = values.get("intent")
    if intent != "transcription":
        raise QueryError(
            ErrorCode.INVALID_FIELD,
            "only transcription sessions are served here: connect with intent=transcription",
        )
    model = values.get("model", default_model)
    if not MODEL_SLUG.fullmatch(model):
        raise QueryError(ErrorCode.INVALID_MODEL, f"model {quote(model)} is not a model id")
    return RealtimeQuery(model=model)


# -- session objects ---------------------------------------------------------------------------


def _object(value: object, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EventError(code="invalid_type", message=f"{param} must be an object", param=param)
    return value


def _known(value: dict[str, Any], allowed: frozenset[str] | set[str], param: str) -> None:
    for key in value:
        if key not in allowed:
            raise EventError(
                code="unknown_parameter",
                message=f"unknown parameter: {param}.{key}",
                param=f"{param}.{key}",
            )


def _turn_detection(value: object, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    detection = _object(value, param)
    _known(detection, _SERVER_VAD_KEYS, param)
    kind = detection.get("type", "server_vad")
    if kind != "server_vad":
        raise EventError(
            code="unsupported_turn_detection",
            message=f"turn_detection type {quote(str(kind))} is not supported: only server_vad",
            param=f"{param}.type",
        )
    for key, value_ in detection.items():
        if key == "type":
            continue
        number = value_ if key not in ("create_response", "interrupt_response") else 0
        bad = isinstance(number, bool) or not isinstance(number, int | float) or number < 0
        # NaN passes "< 0"; JSON's 1e999 is infinity: neither can be echoed as JSON.
        bad = bad or (isinstance(number, float) and not math.isfinite(number))
        if key in ("create_response", "interrupt_response"):
            bad = not isinstance(value_, bool)
        elif key == "idle_timeout_ms" and value_ is None:
            bad = False
        if bad:
            raise EventError(
                code="invalid_value", message=f"{param}.{key} is invalid", param=f"{param}.{key}"
            )
    return {**_SERVER_VAD_DEFAULTS, **detection, "type": "server_vad"}


def _transcription(
    config: RealtimeConfig, value: object, param: str, *, opened: bool
) -> RealtimeConfig:
    if value is None:
        return config
    settings = _object(value, param)
    _known(settings, {"model", "language", "prompt"}, param)
    model = settings.get("model", config.model)
    if not isinstance(model, str) or not MODEL_SLUG.fullmatch(model):
        raise EventError(
            code="invalid_value",
            message=f"{param}.model must be a Talkies model id (GET /v1/models)",
            param=f"{param}.model",
        )
    language = settings.get("language", config.language)
    if language is not None and (not isinstance(language, str) or not 0 < len(language) <= 32):
        raise EventError(
            code="invalid_value", message=f"{param}.language is invalid", param=f"{param}.language"
        )
    prompt = settings.get("prompt", config.prompt)
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise EventError(
            code="invalid_value",
            message=f"{param}.prompt must be a string",
            param=f"{param}.prompt",
        )
    if prompt:
        raise EventError(
            code="unsupported_parameter",
            message="a transcription prompt is not supported by this server",
            param=f"{param}.prompt",
        )
    if opened and (model, language) != (config.model, config.language):
        raise EventError(
            code="session_already_started",
            message="the model and language cannot change once the session's audio has begun",
            param=param,
        )
    return replace(config, model=model, language=language, prompt=prompt)


def _noise_reduction(value: object, param: str) -> None:
    if value is not None:
        raise EventError(
            code="unsupported_parameter",
            message="noise reduction is not supported by this server: set it to null",
            param=param,
        )


def _include(value: object, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(item == LOGPROBS for item in value):
        raise EventError(
            code="invalid_value", message=f"{param} may only hold {LOGPROBS!r}", param=param
        )
    return (LOGPROBS,) if value else ()


def configure(
    config: RealtimeConfig, session: object, *, beta: bool, opened: bool = False
) -> RealtimeConfig:
    """``config`` with a session update's ``session`` applied (absent fields keep their
    values), or :class:`EventError`. ``opened``: the native stream is open, so the model and
    language are fixed."""
    settings = _object(session, "session")
    if beta:
        _known(
            settings,
            {
                "input_audio_format",
                "input_audio_transcription",
                "turn_detection",
                "input_audio_noise_reduction",
                "include",
                "modalities",
            },
            "session",
        )
        audio_format = settings.get("input_audio_format", "pcm16")
        if audio_format != "pcm16":
            raise EventError(
                code="unsupported_audio_format",
                message="only input_audio_format pcm16 (24 kHz) is supported",
                param="session.input_audio_format",
            )
        config = _transcription(
            config,
            settings.get("input_audio_transcription"),
            "session.input_audio_transcription",
            opened=opened,
        )
        detection = config.turn_detection
        if "turn_detection" in settings:
            detection = _turn_detection(settings["turn_detection"], "session.turn_detection")
        _noise_reduction(
            settings.get("input_audio_noise_reduction"), "session.input_audio_noise_reduction"
        )
        include = _include(settings.get("include", list(config.include)), "session.include")
        return replace(config, turn_detection=detection, include=include)
    _known(settings, {"type", "audio", "include"}, "session")
    if settings.get("type", "transcription") != "transcription":
        raise EventError(
            code="invalid_value",
            message="only transcription sessions are served here (session.type transcription)",
            param="session.type",
        )
    audio = _object(settings.get("audio", {}), "session.audio")
    _known(audio, {"input"}, "session.audio")
    inputs = _object(audio.get("input", {}), "session.audio.input")
    param = "session.audio.input"
    _known(inputs, {"format", "transcription", "turn_detection", "noise_reduction"}, param)
    if "format" in inputs:
        audio_format = _object(inputs["format"], f"{param}.format")
        _known(audio_format, {"type", "rate"}, f"{param}.format")
        if (
            audio_format.get("type", "audio/pcm") != "audio/pcm"
            or audio_format.get("rate", INPUT_RATE) != INPUT_RATE
        ):
            raise EventError(
                code="unsupported_audio_format",
                message="only audio/pcm at 24000 Hz is supported",
                param=f"{param}.format",
            )
    config = _transcription(
        config, inputs.get("transcription"), f"{param}.transcription", opened=opened
    )
    detection = config.turn_detection
    if "turn_detection" in inputs:
        detection = _turn_detection(inputs["turn_detection"], f"{param}.turn_detection")
    _noise_reduction(inputs.get("noise_reduction"), f"{param}.noise_reduction")
    include = _include(settings.get("include", list(config.include)), "session.include")
    return replace(config, turn_detection=detection, include=include)


def session_object(config: RealtimeConfig, *, session_id: str, beta: bool) -> dict[str, Any]:
    """The ``session`` of ``session.created`` / ``.updated`` (or the beta's) for ``config``."""
    transcription = {
        "model": config.model,
        "language": config.language,
        "prompt": config.prompt,
    }
    if beta:
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "input_audio_format": "pcm16",
            "input_audio_transcription": transcription,
            "turn_detection": config.turn_detection,
            "input_audio_noise_reduction": None,
            "include": list(config.include),
        }
    return {
        "type": "transcription",
        "id": session_id,
        "object": "realtime.transcription_session",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": INPUT_RATE},
                "transcription": transcription,
                "turn_detection": config.turn_detection,
                "noise_reduction": None,
            }
        },
        "include": list(config.include),
    }


def error_event(error: EventError, *, event_id: str, client_event_id: str | None) -> str:
    """OpenAI's ``error`` event for ``error``."""
    return DUMPS(
        {
            "type": "error",
            "event_id": event_id,
            "error": {
                "type": error.type,
                "code": error.code,
                "message": error.message,
                "param": error.param,
                "event_id": client_event_id,
            },
        }
    )


# -- the translator ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Word:
    word: str
    start: float
    end: float


def _words(raw: object) -> tuple[_Word, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(_Word(str(w["word"]).strip(), float(w["start"]), float(w["end"])) for w in raw)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class RealtimeTranslator:
    """One ``/v1/realtime`` transcription connection's translation, both ways.

    ``session_id`` names the session and seeds its item and event ids (``item_<id>_<n>``):
    the app layer draws it, this class draws nothing and reads no clock.
    """

    def __init__(
        self,
        config: RealtimeConfig,
        *,
        session_id: str,
        max_event_bytes: int,
        max_frame_bytes: int,
    ) -> None:
        self.config = config
        self.opened = False  # the native start was given
        self.streaming = False  # the native ready was seen: audio may flow
        self.closed = False  # the native session's last event was seen
        # The client speaks the beta dialect: it said so at the upgrade (``OpenAI-Beta:
        # realtime=v1``, which the app layer sets before ``connected``) or sent
        # ``transcription_session.update``.
        self.beta = False
        self._session_id = session_id
        self._suffix = session_id.removeprefix("sess_")
        self._max_event = max_event_bytes
        self._max_frame = max(2, max_frame_bytes & ~1)
        self._out: list[str] = []
        self._text: bytearray | None = None
        self._discarding = False  # the rest of a message refused as too large is dropped
        self._too_large: str | None = None  # the detail of that refusal
        self._held: list[bytes | None] = []  # appended before the native ready (None: commit)
        self._events = 0
        self._items = 0
        self._item: str | None = None  # the open item (speech started), if any
        self._last_item: str | None = None
        self._item_start = 0.0  # where the open item's audio begins (seconds)
        self._segment_start = 0.0  # where the engine's current utterance begins
        self._cut_end: float | None = None  # a clear: words ending by here are dropped
        self._cut_count = 0  # a clear, without word times: this many words dropped
        self._hypothesis: tuple[str, tuple[_Word, ...]] = ("", ())
        self._sent = ""  # the open item's text sent in deltas so far (server VAD)
        self._total = 0  # bytes of audio appended (less what a clear dropped before ready)
        self._buffer_from = 0  # of them, where the uncommitted buffer begins (commit, clear, item)
        self._pending_clear: float | None = None  # a clear behind unanswered commits (seconds)
        # Each cut not answered yet: its item (manual) or None (VAD), and where it is (s).
        self._awaiting: deque[tuple[str | None, float]] = deque()
        self._parts: list[str] = []  # manual: the engine's endpoints since the last commit
        self._commit_start = 0.0  # manual: where the next committed item's audio begins
        self._previous_of: dict[str, str | None] = {}  # manual: each awaited item's previous

    # -- client -> session -------------------------------------------------------------------

    def connected(self) -> None:
        """The connection is open: ``session.created`` with the session's settings (the beta's
        ``transcription_session.created`` to a client that asked for the beta)."""
        self._emit(
            {
                "type": "transcription_session.created" if self.beta else "session.created",
                "session": session_object(self.config, session_id=self._session_id, beta=self.beta),
            }
        )

    def client(self, batch: list[ClientInput]) -> list[ClientInput]:
        """The native inputs for one read of client messages."""
        out: list[ClientInput] = []
        for item in batch:
            if isinstance(item, TextReceived):
                out.extend(self._text_part(item))
            elif isinstance(item, AudioBatch | BinaryReceived):
                if isinstance(item, BinaryReceived) and not item.final:
                    continue  # answered once, at its last fragment
                self._refuse(
                    EventError(
                        code="invalid_message",
                        message="binary messages are not supported: send audio in "
                        "input_audio_buffer.append events",
                    ),
                    None,
                )
            else:
                out.append(item)
        return out

    @property
    def holding(self) -> bool:
        """Whether audio or commits wait for :meth:`held`."""
        return bool(self._held)

    def held(self) -> list[ClientInput]:
        """The audio (and commits) appended before the native ready, once it came."""
        out: list[ClientInput] = []
        frames: list[bytes] = []
        for frame in self._held:
            if frame is not None:
                frames.append(frame)
                continue
            if frames:
                out.append(AudioBatch(frames=tuple(frames)))
                frames = []
            out.append(CutRequested())
        self._held = []
        if frames:
            out.append(AudioBatch(frames=tuple(frames)))
        return out

    def _text_part(self, item: TextReceived) -> list[ClientInput]:
        if self._discarding:  # the rest of a message already refused: nothing more of it
            self._discarding = not item.final
            return []
        text = item.data
        if (
            item.final
            and self._text is None
            and isinstance(text, str)
            and 4 * len(text) <= self._max_event  # UTF-8: at most 4 bytes a character
            and text[:1] != "\ufeff"
            and "\x00" not in text[:2]
        ):
            # A whole message (every append): parsed as the str it is. json.loads would
            # decode its UTF-8 back to this same str (no BOM, no NUL in the first two
            # characters: nothing there that selects another encoding), so nothing changes
            # but an encode and a decode.
            return self._event(text)
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        buffered = self._text if self._text is not None else bytearray()
        if len(buffered) + len(data) > self._max_event:
            # The native session refuses it (message_too_large) and closes 4400; its later
            # fragments are not a message of their own (they were parsed as one: an
            # invalid_json error before the refusal).
            self._text = None
            self._discarding = not item.final
            self._too_large = f"the event exceeds the limit of {self._max_event} bytes"
            return [TextReceived(data=b"x" * (MAX_CONTROL_BYTES + 1))]
        if not item.final:
            buffered += data
            self._text = buffered
            return []
        self._text = None
        return self._event(bytes(buffered) + data if buffered else data)

    def _event(self, data: bytes | str) -> list[ClientInput]:
        try:
            event = _parse(data)
        except (ValueError, RecursionError):
            self._refuse(EventError(code="invalid_json", message="the event is not JSON"), None)
            return self._activity()
        if not isinstance(event, dict):
            self._refuse(EventError(code="invalid_event", message="an event is an object"), None)
            return self._activity()
        client_id = event.get("event_id")
        client_id = client_id if isinstance(client_id, str) else None
        kind = event.get("type")
        try:
            if not isinstance(kind, str):
                raise EventError(
                    code="missing_required_parameter", message="the event has no type", param="type"
                )
            if kind == "input_audio_buffer.append":  # the usual one first
                return self._append(event)
            if kind in ("session.update", "transcription_session.update"):
                return self._update(event, beta=kind == "transcription_session.update")
            if kind == "input_audio_buffer.clear":
                self._clear()
                return self._activity()
            if kind == "input_audio_buffer.commit":
                return self._commit() or self._activity()
            if kind in _CONVERSATION_EVENTS:
                raise EventError(
                    code="unsupported_event",
                    message=f"{kind} is not served on a transcription session",
                    param="type",
                )
            raise EventError(
                code="invalid_event_type",
                message=f"unknown event type {quote(kind)}",
                param="type",
            )
        except EventError as error:
            self._refuse(error, client_id)
            return self._activity()

    def _activity(self) -> list[ClientInput]:
        # Client activity for the native idle timer (no audio), once the stream is live.
        return [AudioBatch(frames=())] if self.streaming and not self.closed else []

    def _update(self, event: dict[str, Any], *, beta: bool) -> list[ClientInput]:
        was_manual = self.config.turn_detection is None
        self.config = configure(self.config, event.get("session"), beta=beta, opened=self.opened)
        self.beta = beta
        self._emit(
            {
                "type": "transcription_session.updated" if beta else "session.updated",
                "session": session_object(self.config, session_id=self._session_id, beta=beta),
            }
        )
        manual = self.config.turn_detection is None
        if self.opened and manual != was_manual:
            return self._switch(manual=manual) or self._activity()
        return self._open() or self._activity()

    def _open(self) -> list[ClientInput]:
        if self.opened:
            return []
        self.opened = True
        return [TextReceived(data=self.config.start_message())]

    def _append(self, event: dict[str, Any]) -> list[ClientInput]:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise EventError(
                code="missing_required_parameter",
                message="input_audio_buffer.append needs audio (base64 PCM16)",
                param="audio",
            )
        try:
            # strict_mode takes only what validate=True takes, and gives the same bytes
            # (a2b_base64 without the regex b64decode checks with first); whatever it
            # refuses is decided by b64decode itself, as before.
            pcm = binascii.a2b_base64(audio, strict_mode=True)
        except (binascii.Error, ValueError):
            try:
                pcm = base64.b64decode(audio, validate=True)
            except (binascii.Error, ValueError):
                raise EventError(
                    code="invalid_value", message="audio is not valid base64", param="audio"
                ) from None
        if len(pcm) & 1:
            raise EventError(
                code="invalid_value",
                message="audio must be whole PCM16 samples (an even number of bytes)",
                param="audio",
            )
        if not pcm:
            return self._activity()
        self._total += len(pcm)
        step = self._max_frame
        frames = (
            [pcm] if len(pcm) <= step else [pcm[i : i + step] for i in range(0, len(pcm), step)]
        )
        opening = self._open()
        if not self.streaming:
            self._held.extend(frames)
            return opening
        return [AudioBatch(frames=tuple(frames))]

    @property
    def _buffered(self) -> int:
        """Bytes of audio appended and not committed (nor cleared, nor an item's)."""
        return self._total - self._buffer_from

    def _commit(self) -> list[ClientInput]:
        buffered = self._buffered
        if buffered < _MIN_COMMIT_BYTES:
            raise EventError(
                code="input_audio_buffer_commit_empty",
                message="buffer too small: expected at least 100ms of audio, but the buffer "
                f"has {buffered / (2 * INPUT_RATE / 1000):.2f}ms",
            )
        return self._cut_here(manual=self.config.turn_detection is None)

    def _cut_here(self, *, manual: bool) -> list[ClientInput]:
        """Commit the buffer: a manual item now, transcribed when the cut answers; or (server
        VAD) the end of the open item, as a pause would end it."""
        self._buffer_from = self._total
        item: str | None = None
        if manual:
            item, previous = self._new_item()
            self._previous_of[item] = previous
            self._emit_committed(item, previous)
        # Where the cut is: the native answer's audio_seconds is all the session had taken by
        # then, which may be more (appends after the commit, before its answer).
        self._awaiting.append((item, self._total / (2 * INPUT_RATE)))
        if not self.streaming:
            self._held.append(None)
            return []
        return [CutRequested()]

    def _switch(self, *, manual: bool) -> list[ClientInput]:
        """``turn_detection`` changed mode mid-session: what the old mode had open is
        committed under it first, so no item is left open nor text carried into another."""
        if manual and self._item is not None:
            return self._cut_here(manual=False)  # the open item ends here
        if not manual and (self._parts or self._buffered >= _MIN_COMMIT_BYTES):
            return self._cut_here(manual=True)  # the audio since the last commit is an item
        return []

    def _clear(self) -> None:
        # All the audio appended and not committed is dropped: held before the native ready,
        # it is never sent; sent, the engine keeps it, and words heard in it are dropped from
        # what follows (by their times: up to the audio appended so far, decoded or not; by
        # their count without times). Text already sent in deltas cannot be taken back: its
        # item ends here, with that text; an item with nothing sent is dropped.
        if not self.streaming:
            keep = len(self._held)
            while keep and self._held[keep - 1] is not None:
                keep -= 1
            self._total -= sum(len(f) for f in self._held[keep:] if f is not None)
            del self._held[keep:]
        self._buffer_from = self._total
        at = self._total / (2 * INPUT_RATE)  # seconds, on the engine's time line
        if self._awaiting:
            # Commits not answered yet keep their audio and text: the clear applies after.
            self._pending_clear = at
        else:
            self._apply_clear(at)
        self._emit({"type": "input_audio_buffer.cleared"})

    def _apply_clear(self, at: float) -> None:
        text, words = self._hypothesis
        if self._item is not None:
            if self._sent:
                end = words[-1].end if words else self._item_start
                self._finish(self._item, self._sent, "", end)
            else:
                self._item = None
        end = max(at, words[-1].end if words else 0.0, self._cut_end or 0.0)
        if end > 0.0:
            self._cut_end = end
        if not words:
            self._cut_count += len(text.split())
        self._hypothesis = ("", ())
        self._parts = []
        self._commit_start = max(self._commit_start, at)

    def _refuse(self, error: EventError, client_id: str | None) -> None:
        if not self.closed:
            self._out.append(
                error_event(error, event_id=self._event_id(), client_event_id=client_id)
            )

    # -- session -> client -------------------------------------------------------------------

    def session(self, text: str) -> None:
        """One native event (as the session wrote it)."""
        event = json.loads(text)
        kind = event["type"]
        if kind == "ready":
            self.streaming = True
        elif kind == "partial":
            self._partial(event)
        elif kind == "endpoint" and event.get("cut") is True:
            self._cut(event)
        elif kind in ("endpoint", "final"):
            if self.config.turn_detection is None:
                self._manual_endpoint(event, final=kind == "final")
            else:
                self._endpoint(event)
        elif kind == "stats":
            self.closed = True
        elif kind == "error":
            code = str(event["code"])
            detail = str(event["detail"])
            if code == ErrorCode.MESSAGE_TOO_LARGE.value and self._too_large is not None:
                detail = self._too_large  # the native wording names its control messages' limit
            elif code == ErrorCode.IDLE_TIMEOUT.value and not self.opened:
                # A Realtime client has no start message: what it did not send is these.
                detail = detail.replace("no start message", "no session.update nor audio")
            if self._item is not None and code == ErrorCode.SERVER_ERROR.value:
                self._emit(
                    {
                        "type": "conversation.item.input_audio_transcription.failed",
                        "item_id": self._item,
                        "content_index": 0,
                        "error": {"type": "server_error", "code": code, "message": detail},
                    }
                )
            error = EventError(
                code=code,
                message=detail,
                type="server_error"
                if code == ErrorCode.SERVER_ERROR.value
                else "invalid_request_error",
            )
            self._refuse(error, None)
            self.closed = True

    def closing(self) -> None:
        """The connection is closing: the translator says nothing more of its own."""
        self.closed = True

    @property
    def has_messages(self) -> bool:
        """Whether :meth:`pull_messages` has OpenAI events to give."""
        return bool(self._out)

    def pull_messages(self) -> list[str]:
        """The OpenAI events produced since the last call, in order."""
        out, self._out = self._out, []
        return out

    def _after_cut(self, text: str, words: tuple[_Word, ...]) -> tuple[str, tuple[_Word, ...]]:
        if self._cut_end is not None and words:
            kept = tuple(w for w in words if (w.start + w.end) / 2 > self._cut_end)
            return " ".join(w.word for w in kept), kept
        if self._cut_count:
            return " ".join(text.split()[self._cut_count :]), words[self._cut_count :]
        return text, words

    def _partial(self, event: dict[str, Any]) -> None:
        raw = str(event["text"])
        heard = _words(event.get("words"))
        text, words = self._after_cut(raw.strip(), heard)
        self._hypothesis = (text, words)
        if self.config.turn_detection is None or self._awaiting_manual:
            return  # manual: items begin at commits (words before one awaited are its)
        if self._item is None and text:
            self._speech_started(words[0].start if words else self._segment_start)
        stable = event.get("stable")
        if type(stable) is int and self._item is not None:
            prefix = self._stable_prefix(raw, heard, stable)
            if (
                prefix is not None
                and len(prefix) > len(self._sent)
                and prefix.startswith(self._sent)
            ):
                self._delta(self._item, prefix[len(self._sent) :])
                self._sent = prefix

    def _stable_prefix(self, raw: str, heard: tuple[_Word, ...], stable: int) -> str | None:
        """The text of the item that will not change: the engine's stable prefix, less the
        words a clear dropped (by their times: the stable words, one per word of the text,
        after the clear). None where it cannot be told (a clear without word times)."""
        if self._cut_end is None and not self._cut_count:
            return raw[:stable].strip()
        if self._cut_end is None or len(heard) != len(raw.split()):
            return None
        count = len(raw[:stable].split())
        end = self._cut_end
        return " ".join(w.word for w in heard[:count] if (w.start + w.end) / 2 > end)

    def _new_item(self) -> tuple[str, str | None]:
        self._items += 1
        item = f"item_{self._suffix}_{self._items}"
        previous, self._last_item = self._last_item, item
        return item, previous

    def _speech_started(self, start: float) -> None:
        self._items += 1
        self._item = f"item_{self._suffix}_{self._items}"
        self._item_start = start
        self._emit(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": _ms(start),
                "item_id": self._item,
            }
        )

    def _endpoint(self, event: dict[str, Any], at: float | None = None) -> bool:
        """A server-VAD utterance's end (``at``: a commit's, where it was): its item, if it
        had words (whether it had)."""
        text, words = self._after_cut(str(event["text"]).strip(), _words(event.get("words")))
        end = _utterance_end(event, words, at)
        if self._item is None and text:
            self._speech_started(words[0].start if words else self._segment_start)
        item = self._item
        self._next_utterance(end)
        if item is None:
            return False  # an endpoint after no words: no item
        sent = self._sent
        if text.startswith(sent):
            rest = text[len(sent) :]
        else:  # (an engine that broke its promise: what was sent stays, then the new words)
            extra = text.split()[len(sent.split()) :]
            rest = " " + " ".join(extra) if extra and sent else " ".join(extra)
        # The item's audio ends with its speech: what was appended after that (the engine
        # answers a pause later, and audio_seconds counts all the session took) stays in the
        # buffer for a commit. Without word times, all of it is the item's.
        spoken = words[-1].end if words else end
        self._buffer_from = max(self._buffer_from, min(self._total, 2 * round(spoken * INPUT_RATE)))
        # speech_stopped says so too: the engine's endpoint comes a pause later, when the next
        # item's speech may have begun (its audio_start_ms is then before that endpoint).
        self._finish(item, sent + rest, rest, spoken)
        return True

    def _finish(self, item: str, transcript: str, delta: str, end: float) -> None:
        """A server-VAD item's end: stopped, committed, added, its last delta, completed."""
        previous, self._last_item = self._last_item, item
        self._item = None
        self._sent = ""
        self._emit(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": _ms(end), "item_id": item}
        )
        self._emit_committed(item, previous)
        self._transcript(item, previous, transcript, delta, max(0.0, end - self._item_start))

    def _next_utterance(self, end: float) -> None:
        self._segment_start = end
        self._hypothesis = ("", ())
        if self._cut_end is None or end >= self._cut_end:  # else: cleared audio still to come
            self._cut_end = None
        self._cut_count = 0

    def _cut(self, event: dict[str, Any]) -> None:
        """The answer to a commit: a manual item's transcript, or (server VAD) the open
        item's end."""
        item, at = self._awaiting.popleft() if self._awaiting else (None, None)
        if item is None:
            if not self._endpoint(event, at):
                # A commit under server VAD with no words in it: an item all the same, with
                # an empty transcript (OpenAI answers every commit it takes).
                item, previous = self._new_item()
                self._emit_committed(item, previous)
                self._transcript(item, previous, "", "", 0.0)
        else:
            text, words = self._after_cut(str(event["text"]).strip(), _words(event.get("words")))
            end = _utterance_end(event, words, at)
            transcript = " ".join(part for part in (*self._parts, text) if part)
            self._parts = []
            self._next_utterance(end)
            previous = self._previous_of.pop(item, None)
            seconds = max(0.0, end - self._commit_start)
            self._transcript(item, previous, transcript, transcript, seconds)
            self._commit_start = end
        if not self._awaiting and self._pending_clear is not None:
            at, self._pending_clear = self._pending_clear, None
            self._apply_clear(at)

    @property
    def _awaiting_manual(self) -> bool:
        return any(item is not None for item, _ in self._awaiting)

    def _manual_endpoint(self, event: dict[str, Any], *, final: bool) -> None:
        """Manual commits: the engine's own endpoints wait for the next commit's item (the
        final, at the close, is audio no commit took: dropped, as OpenAI drops it)."""
        text, words = self._after_cut(str(event["text"]).strip(), _words(event.get("words")))
        end = _utterance_end(event, words, None)
        if text and not final:
            self._parts.append(text)
        self._next_utterance(end)

    def _emit_committed(self, item: str, previous: str | None) -> None:
        """An item committed: ``input_audio_buffer.committed``, then the item added."""
        self._emit(
            {"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item}
        )
        self._emit_added(item, previous)

    def _emit_added(self, item: str, previous: str | None) -> None:
        added = "conversation.item.created" if self.beta else "conversation.item.added"
        self._emit({"type": added, "previous_item_id": previous, "item": _item(item, None)})

    def _delta(self, item: str, delta: str) -> None:
        self._emit(
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": item,
                "content_index": 0,
                "delta": delta,
            }
        )

    def _transcript(
        self, item: str, previous: str | None, transcript: str, delta: str, seconds: float
    ) -> None:
        if delta:
            self._delta(item, delta)
        self._emit(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item,
                "content_index": 0,
                "transcript": transcript,
                "usage": {"type": "duration", "seconds": round(seconds, 3)},
            }
        )
        if not self.beta:
            self._emit(
                {
                    "type": "conversation.item.done",
                    "previous_item_id": previous,
                    "item": _item(item, transcript),
                }
            )

    def _event_id(self) -> str:
        self._events += 1
        return f"event_{self._suffix}_{self._events}"

    def _emit(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        self._out.append(DUMPS({"event_id": self._event_id(), **message}))


def _item(item_id: str, transcript: str | None) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def _utterance_end(event: dict[str, Any], words: Sequence[_Word], at: float | None) -> float:
    """Where the utterance an endpoint closes ends: a commit's cut where it was (``at``);
    else its last word's end; with no words, the audio the session had taken (a pause the
    engine noticed, later: the next utterance may have begun by then)."""
    if at is not None:
        return max(at, words[-1].end if words else 0.0)
    return words[-1].end if words else float(event["audio_seconds"])


def _parse(data: bytes | str) -> Any:
    """``json.loads(data)``, the same value or the same error class, faster for the usual
    message: a str that is one JSON object from its first character to its last."""
    if type(data) is str and data[:1] == "{" and data[-1:] == "}":
        try:
            value, end = _SCAN(data, 0)
        except StopIteration:  # not reached: "{" always starts an object or its error
            return json.loads(data)
        if end == len(data):
            return value
    return json.loads(data)
