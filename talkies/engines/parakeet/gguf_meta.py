"""Read metadata keys from the header of a GGUF file, without loading its tensors.

The parakeet.cpp executor needs a few facts about a model before any native call: that the
file is a parakeet.cpp GGUF at all, and which language prompts it knows (so a stream asking
for another language is refused on the event loop, where no native call may run). GGUF
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) keeps them in its key/value header:
``"GGUF"``, a version, the tensor and key counts, then each key as a length-prefixed UTF-8
string, a value type and the value. Only versions 2 and 3 (64-bit counts) are read.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUFError", "read_metadata"]

_MAGIC = b"GGUF"
# Value types: their struct format (fixed size) or None (string, array).
_SCALARS = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
_STRING, _ARRAY = 8, 9
# Bounds a real header never reaches: a corrupt count fails fast instead of reading on.
_MAX_STRING = 1 << 20
_MAX_KEYS = 1 << 16
_MAX_ARRAY = 1 << 24

Value = int | float | bool | str | list["Value"]


class GGUFError(ValueError):
    """The file is not a readable GGUF file."""


def _read(f: BinaryIO, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("the file ends inside its header")
    return data


def _unpack(f: BinaryIO, fmt: str) -> int | float | bool:
    value: int | float | bool = struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    return value


def _string(f: BinaryIO) -> str:
    size = int(_unpack(f, "<Q"))
    if size > _MAX_STRING:
        raise GGUFError(f"a header string of {size} bytes")
    try:
        return _read(f, size).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GGUFError("a header string that is not UTF-8") from exc


def _value(f: BinaryIO, kind: int, keep: bool) -> Value | None:
    """Read (``keep``) or skip one value of type ``kind``."""
    fmt = _SCALARS.get(kind)
    if fmt is not None:
        if keep:
            return _unpack(f, fmt)
        f.seek(struct.calcsize(fmt), 1)
        return None
    if kind == _STRING:
        if keep:
            return _string(f)
        f.seek(int(_unpack(f, "<Q")), 1)
        return None
    if kind == _ARRAY:
        item_kind, count = int(_unpack(f, "<I")), int(_unpack(f, "<Q"))
        if count > _MAX_ARRAY or item_kind == _ARRAY:
            raise GGUFError(f"an array of {count} items of type {item_kind}")
        item_fmt = _SCALARS.get(item_kind)
        if not keep and item_fmt is not None:
            f.seek(count * struct.calcsize(item_fmt), 1)
            return None
        items = [_value(f, item_kind, keep) for _ in range(count)]
        return [item for item in items if item is not None] if keep else None
    raise GGUFError(f"unknown value type {kind}")


def read_metadata(path: Path, keys: Collection[str]) -> dict[str, Value]:
    """The values of those of ``keys`` that the header of ``path`` has.

    Raises :class:`GGUFError` for a file that is not GGUF version 2 or 3, and ``OSError``
    when it cannot be read. Stops reading once every key was found.
    """
    wanted = set(keys)
    found: dict[str, Value] = {}
    with path.open("rb") as f:
        if f.read(4) != _MAGIC:
            raise GGUFError("not a GGUF file (no GGUF magic number)")
        version = int(_unpack(f, "<I"))
        if version not in (2, 3):
            raise GGUFError(f"GGUF version {version} (only 2 and 3 are read)")
        _tensors, count = int(_unpack(f, "<Q")), int(_unpack(f, "<Q"))
        if count > _MAX_KEYS:
            raise GGUFError(f"{count} header keys")
        for _ in range(count):
            if len(found) == len(wanted):
                break
            key = _string(f)
            kind = int(_unpack(f, "<I"))
            value = _value(f, kind, key in wanted)
            if key in wanted and value is not None:
                found[key] = value
    return found
