"""Wyoming's framing, sans-IO and capped where the bytes enter.

An event on the wire is a JSON header line (``{"type", "data"?, "data_length"?,
"payload_length"?, "version"?}`` and a newline), then ``data_length`` bytes of JSON data
(merged over the header's own ``data``), then ``payload_length`` bytes of payload. This is
the framing of the ``wyoming`` package (``wyoming.event.async_write_event`` writes it, and
:func:`encode` writes the same bytes); its reader, ``async_read_event``, buffers whatever a
header declares, so the server reads with :class:`EventReader`, which refuses a header line,
data block or payload past its caps before buffering it, and anything that is not the framing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_DATA_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_TYPE_CHARS",
    "EventReader",
    "FramingError",
    "WireEvent",
    "encode",
]

# A header line: a type and two lengths, or an old client's inline data (a synthesize with
# 4096 characters of text fits).
MAX_HEADER_BYTES = 65536
MAX_DATA_BYTES = 65536
# One audio chunk: a second of 48 kHz stereo 32-bit audio is 384 kB.
MAX_PAYLOAD_BYTES = 1 << 20
MAX_TYPE_CHARS = 64
VERSION = "1.10.2"  # the wyoming package's version this framing follows


class FramingError(ValueError):
    """The bytes are not Wyoming's framing, or past a cap; the message is client-safe."""


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One event as read: its type, its data (a JSON object) and its payload."""

    type: str
    data: dict[str, Any]
    payload: bytes | None = None


def _length(header: dict[str, Any], key: str, cap: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FramingError(f"{key} must be a non-negative integer")
    if value > cap:
        raise FramingError(f"{key} {value} is over the limit of {cap} bytes")
    return value


def _json_object(raw: bytes | bytearray, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise FramingError(f"the {what} is not JSON") from None
    except RecursionError:
        raise FramingError(f"the {what} is nested too deeply") from None
    if not isinstance(value, dict):
        raise FramingError(f"the {what} must be a JSON object")
    return value


class EventReader:
    """Bytes in (:meth:`feed`), events out (:meth:`next_event`); raises :class:`FramingError`.

    Holds at most one header line, one data block and one payload (each capped) plus what a
    single read brought after them.
    """

    def __init__(
        self,
        *,
        max_header: int = MAX_HEADER_BYTES,
        max_data: int = MAX_DATA_BYTES,
        max_payload: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self._buffer = bytearray()
        self._max_header = max_header
        self._max_data = max_data
        self._max_payload = max_payload
        self._header: dict[str, Any] | None = None
        self._need = 0  # data + payload bytes the current header declared
        self._data_length = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def pending(self) -> bool:
        """Part of an event has arrived (an end of the stream here cuts it off)."""
        return bool(self._buffer) or self._header is not None

    def next_event(self) -> WireEvent | None:
        """The next complete event, or None until more bytes come."""
        if self._header is None:
            end = self._buffer.find(b"\n", 0, self._max_header + 1)
            if end < 0:
                if len(self._buffer) > self._max_header:
                    raise FramingError(
                        f"a header line is longer than the limit of {self._max_header} bytes"
                    )
                return None
            header = _json_object(self._buffer[:end], "header line")
            del self._buffer[: end + 1]
            kind = header.get("type")
            if not isinstance(kind, str) or not kind or len(kind) > MAX_TYPE_CHARS:
                raise FramingError(f"the header's type must be a string of 1-{MAX_TYPE_CHARS}")
            inline = header.get("data", {})
            if not isinstance(inline, dict):
                raise FramingError("the header's data must be a JSON object")
            self._data_length = _length(header, "data_length", self._max_data)
            self._need = self._data_length + _length(header, "payload_length", self._max_payload)
            self._header = header
        if len(self._buffer) < self._need:
            return None
        header, self._header = self._header, None
        data: dict[str, Any] = dict(header.get("data", {}))
        if self._data_length:
            data.update(_json_object(self._buffer[: self._data_length], "data block"))
        payload = bytes(self._buffer[self._data_length : self._need]) or None
        del self._buffer[: self._need]
        return WireEvent(type=header["type"], data=data, payload=payload)


def encode(kind: str, data: dict[str, Any] | None = None, payload: bytes | None = None) -> bytes:
    """An event's bytes, as ``wyoming.event.async_write_event`` writes them."""
    header: dict[str, Any] = {"type": kind, "version": VERSION}
    data_bytes = b""
    if data:
        data_bytes = _json_bytes(data)
        header["data_length"] = len(data_bytes)
    if payload:
        header["payload_length"] = len(payload)
    line = _json_bytes(header) + b"\n"
    return line + data_bytes + (payload or b"")


def _json_bytes(value: dict[str, Any]) -> bytes:
    """JSON as UTF-8; a string UTF-8 cannot hold (a lone surrogate, which JSON can carry and
    a client may send, to be echoed back) is escaped instead."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value).encode("ascii")
