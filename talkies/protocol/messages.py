"""The control-message parser: start, end and cancel (spec: "Start and audio contract").

Pure functions over bytes. Every rejection is a :class:`ProtocolError` with the spec's code;
anything else (``RecursionError`` from deep nesting, ``ValueError`` from huge numbers) is
caught here and mapped, so a caller only ever sees ``ProtocolError``.

Checks run in a fixed order and the first failure wins; ``docs/protocol.md`` lists it:
size, UTF-8, JSON syntax, duplicate keys, object, ``type``; then, only where the message
type is allowed in the current state, unknown fields, missing fields, and each field's JSON
type and value in the order of the spec's table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .errors import ErrorCode, ProtocolError
from .events import CHANNELS, ENCODING, SAMPLE_RATE

__all__ = [
    "MAX_CONTROL_BYTES",
    "MODEL_SLUG",
    "Envelope",
    "MessageType",
    "StartOptions",
    "check_control",
    "normalize_language",
    "parse_envelope",
    "parse_start",
]

# Spec: "Start/control JSON is capped at 4096 UTF-8 bytes".
MAX_CONTROL_BYTES = 4096

# A model slug as the registry writes them ("nemotron-3.5-asr-0.6b"). A string outside this
# shape cannot name any model, so it is ``invalid_model`` (4400), not ``unknown_model`` (4404).
MODEL_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# BCP-47-style tag: language, optional script, optional region, optional variants. "_" is
# accepted as a separator because POSIX locale names (pt_BR) are what many clients hold.
_LANGUAGE_TAG = re.compile(
    r"(?P<lang>[A-Za-z]{2,3})"
    r"(?:[-_](?P<script>[A-Za-z]{4}))?"
    r"(?:[-_](?P<region>[A-Za-z]{2}|[0-9]{3}))?"
    r"(?P<variants>(?:[-_](?:[A-Za-z0-9]{5,8}|[0-9][A-Za-z0-9]{3}))*)"
)
_MAX_LANGUAGE_CHARS = 35


class MessageType(Enum):
    """The ``type`` of a well-formed control object."""

    START = "start"
    END = "end"
    CANCEL = "cancel"
    OTHER = "other"  # any other string: where it may appear is the state table's business


@dataclass(frozen=True, kw_only=True, slots=True)
class Envelope:
    """A JSON object that passed the shape checks every text message gets."""

    type: MessageType
    type_name: str
    body: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class StartOptions:
    """A validated start message: what the engine stream is opened with."""

    model: str
    language: str | None = None  # None: the backend's default; "auto": detect
    interim_results: bool = True
    word_timestamps: bool = False
    encoding: str = ENCODING
    sample_rate: int = SAMPLE_RATE
    channels: int = CHANNELS


def _quote(name: str, limit: int = 64) -> str:
    """A client-supplied name, escaped and shortened, safe to echo in a detail."""
    text = json.dumps(name, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 4] + '..."'


class _DuplicateKeys:
    """``object_pairs_hook`` that notes the first duplicate key instead of dropping it.

    It must run inside the parser: ``dict`` construction would silently keep the last value.
    It records rather than raises, so a later syntax error still wins (syntax is checked
    first, whatever the order of the bytes).
    """

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj and self.first is None:
                self.first = key
            obj[key] = value
        return obj


def _reject_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity are Python extensions, not JSON.
    raise ValueError(f"{name} is not valid JSON")


def parse_envelope(data: bytes) -> Envelope:
    """Check size, UTF-8, JSON, duplicate keys, object shape and ``type`` of one message."""
    if len(data) > MAX_CONTROL_BYTES:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"control message is {len(data)} bytes; the limit is {MAX_CONTROL_BYTES}",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, "control message is not valid UTF-8") from exc
    duplicates = _DuplicateKeys()
    try:
        value = json.loads(text, object_pairs_hook=duplicates, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError is a ValueError; deep nesting raises RecursionError.
        raise ProtocolError(ErrorCode.INVALID_JSON, "control message is not valid JSON") from exc
    if duplicates.first is not None:
        raise ProtocolError(
            ErrorCode.DUPLICATE_FIELD, f"duplicate field {_quote(duplicates.first)}"
        )
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "control message must be a JSON object")
    if "type" not in value:
        raise ProtocolError(ErrorCode.MISSING_FIELD, 'missing required field "type"')
    type_name = value["type"]
    if not isinstance(type_name, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "type" must be a string')
    try:
        kind = MessageType(type_name)
    except ValueError:
        kind = MessageType.OTHER
    return Envelope(type=kind, type_name=type_name, body=value)


_START_FIELDS = (
    "type",
    "model",
    "encoding",
    "sample_rate",
    "channels",
    "language",
    "interim_results",
    "word_timestamps",
)
_START_REQUIRED = ("model", "encoding", "sample_rate", "channels")


def _check_fields(body: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    for key in body:
        if key not in allowed:
            raise ProtocolError(ErrorCode.UNKNOWN_FIELD, f"unknown field {_quote(key)} in {what}")


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python but not a JSON number.
    return type(value) is int


def normalize_language(tag: str) -> str | None:
    """``auto`` or a canonical-case BCP-47-style tag (``pt_br`` -> ``pt-BR``); None if invalid."""
    if tag == "auto":
        return tag
    if len(tag) > _MAX_LANGUAGE_CHARS:
        return None
    match = _LANGUAGE_TAG.fullmatch(tag)
    if match is None:
        return None
    parts = [match["lang"].lower()]
    if match["script"]:
        parts.append(match["script"].title())
    if match["region"]:
        parts.append(match["region"].upper())
    parts.extend(v.lower() for v in re.split(r"[-_]", match["variants"]) if v)
    return "-".join(parts)


def parse_start(body: dict[str, Any]) -> StartOptions:
    """Validate the fields of a ``start`` object (its envelope already passed)."""
    _check_fields(body, _START_FIELDS, "start")
    for key in _START_REQUIRED:
        if key not in body:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing required field {_quote(key)}")

    model = body["model"]
    if not isinstance(model, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "model" must be a string')
    if MODEL_SLUG.fullmatch(model) is None:
        raise ProtocolError(
            ErrorCode.INVALID_MODEL,
            'field "model" must be a model slug (letters, digits, ".", "_", "-"; 1-128 chars)',
        )

    encoding = body["encoding"]
    if not isinstance(encoding, str):
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "encoding" must be a string')
    if encoding != ENCODING:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_ENCODING, f'encoding must be "{ENCODING}", got {_quote(encoding)}'
        )

    sample_rate = body["sample_rate"]
    if not _is_int(sample_rate):
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "sample_rate" must be an integer')
    if sample_rate != SAMPLE_RATE:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sample_rate must be {SAMPLE_RATE}, got {sample_rate}"[:200],
        )

    channels = body["channels"]
    if not _is_int(channels):
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "channels" must be an integer')
    if channels != CHANNELS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_CHANNELS, f"channels must be {CHANNELS}, got {channels}"[:200]
        )

    language: str | None = None
    if "language" in body:
        raw = body["language"]
        if not isinstance(raw, str):
            raise ProtocolError(ErrorCode.INVALID_FIELD, 'field "language" must be a string')
        language = normalize_language(raw)
        if language is None:
            raise ProtocolError(
                ErrorCode.INVALID_LANGUAGE,
                f'language must be "auto" or a language tag such as "en-US", got {_quote(raw)}',
            )

    flags: dict[str, bool] = {"interim_results": True, "word_timestamps": False}
    for key in flags:
        if key in body:
            value = body[key]
            if not isinstance(value, bool):
                raise ProtocolError(ErrorCode.INVALID_FIELD, f'field "{key}" must be a boolean')
            flags[key] = value

    return StartOptions(
        model=model,
        language=language,
        interim_results=flags["interim_results"],
        word_timestamps=flags["word_timestamps"],
    )


def check_control(envelope: Envelope) -> None:
    """``end`` and ``cancel`` are exactly ``{"type": ...}``: any other field is rejected."""
    _check_fields(envelope.body, ("type",), envelope.type_name)
