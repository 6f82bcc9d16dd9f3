"""Reading a faster-whisper (CTranslate2) Whisper folder: the ``model.bin`` index of
variables (memory-mapped, dequantized on demand) and the vocabulary."""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["Ct2Checkpoint", "Ct2FormatError", "read_vocabulary"]

# CTranslate2's DataType enum order (include/ctranslate2/types.h).
_CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_NUMPY_DTYPES: dict[str, str] = {
    "float32": "<f4",
    "int8": "i1",
    "int16": "<i2",
    "int32": "<i4",
    "float16": "<f2",
    "bfloat16": "<u2",
}
_SUPPORTED_BINARY_VERSIONS = range(4, 7)

Array = npt.NDArray[np.float32]


class Ct2FormatError(ValueError):
    """The folder or file is not a CTranslate2 Whisper checkpoint this converter understands."""


@dataclass(frozen=True, slots=True)
class _Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int


class Ct2Checkpoint:
    """A memory-mapped CTranslate2 ``model.bin`` (binary versions 4-6): an index of variables.

    Layout (python/ctranslate2/specs/model_spec.py ``_serialize``): uint32 binary version,
    spec name, uint32 spec revision, uint32 variable count, then per variable its name, uint8
    rank, uint32 dims, uint8 dtype id, uint32 byte count and the bytes; then uint32 alias
    count and (alias, target) name pairs. Strings are uint16 length (with the NUL) + bytes + NUL.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as file:
            try:
                self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # an empty file cannot be mapped
                raise Ct2FormatError(f"{path}: empty file") from exc
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError) as exc:
            self.close()
            raise Ct2FormatError(f"{path}: truncated or not a CTranslate2 model") from exc
        except Ct2FormatError:
            self.close()
            raise

    def _parse(self) -> None:
        buf = self._map
        pos = 0

        def take(fmt: str) -> int:
            nonlocal pos
            (value,) = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return int(value)

        def string() -> str:
            nonlocal pos
            length = take("H")
            if length < 1 or pos + length > len(buf):
                raise Ct2FormatError(f"{self.path}: bad string at byte {pos}")
            text = bytes(buf[pos : pos + length - 1]).decode("utf-8")
            pos += length
            return text

        self.binary_version = take("I")
        if self.binary_version not in _SUPPORTED_BINARY_VERSIONS:
            first, last = _SUPPORTED_BINARY_VERSIONS[0], _SUPPORTED_BINARY_VERSIONS[-1]
            raise Ct2FormatError(
                f"{self.path}: CTranslate2 binary version {self.binary_version} is not "
                f"supported (expected {first}-{last})"
            )
        self.spec = string()
        self.revision = take("I")
        self.variables: dict[str, _Variable] = {}
        for _ in range(take("I")):
            name = string()
            rank = take("B")
            shape = tuple(take("I") for _ in range(rank))
            type_id = take("B")
            nbytes = take("I")
            if type_id >= len(_CT2_DTYPES):
                raise Ct2FormatError(f"{self.path}: variable {name!r} has unknown type {type_id}")
            dtype = _CT2_DTYPES[type_id]
            expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY_DTYPES[dtype]).itemsize
            if nbytes != expected or pos + nbytes > len(buf):
                raise Ct2FormatError(f"{self.path}: variable {name!r} has a bad size")
            self.variables[name] = _Variable(name, shape, dtype, pos, nbytes)
            pos += nbytes
        self.aliases: dict[str, str] = {}
        for _ in range(take("I")):
            alias = string()
            self.aliases[alias] = string()

    def close(self) -> None:
        # A caller may still hold a view from raw(): then the GC unmaps the file later.
        with contextlib.suppress(BufferError):
            self._map.close()

    def __enter__(self) -> Ct2Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _resolve(self, name: str) -> _Variable | None:
        seen = 0
        while name in self.aliases and seen < 16:
            name, seen = self.aliases[name], seen + 1
        return self.variables.get(name)

    def has(self, name: str) -> bool:
        return self._resolve(name) is not None

    def shape(self, name: str) -> tuple[int, ...]:
        return self._variable(name).shape

    def _variable(self, name: str) -> _Variable:
        var = self._resolve(name)
        if var is None:
            raise Ct2FormatError(f"{self.path}: missing variable {name!r}")
        return var

    def raw(self, name: str) -> npt.NDArray[np.generic]:
        """The stored values, as stored (a read-only view into the file)."""
        var = self._variable(name)
        data = np.frombuffer(
            self._map,
            dtype=_NUMPY_DTYPES[var.dtype],
            count=int(np.prod(var.shape)),
            offset=var.offset,
        )
        return data.reshape(var.shape)

    def scalar(self, name: str) -> int:
        return int(self.raw(name).reshape(-1)[0])

    def tensor(self, name: str) -> Array:
        """A weight as float32, dequantized when CTranslate2 stored it as int8/int16."""
        var = self._variable(name)
        data = self.raw(name)
        if var.dtype == "bfloat16":
            return (data.astype(np.uint32) << 16).view(np.float32)
        if var.dtype in ("int8", "int16"):
            scale_name = name + "_scale"
            if not self.has(scale_name):
                raise Ct2FormatError(f"{self.path}: quantized {name!r} has no {scale_name!r}")
            scale = self.tensor(scale_name)
            if scale.ndim == 1 and data.ndim == 2:
                scale = scale[:, None]
            return (data.astype(np.float32) / scale).astype(np.float32)
        return data.astype(np.float32)


def read_vocabulary(ct2_dir: Path) -> list[str]:
    """Token strings by id, from vocabulary.json, vocabulary.txt or tokenizer.json."""
    as_json = ct2_dir / "vocabulary.json"
    as_text = ct2_dir / "vocabulary.txt"
    tokenizer = ct2_dir / "tokenizer.json"
    if as_json.is_file():
        tokens = json.loads(as_json.read_text(encoding="utf-8"))
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise Ct2FormatError(f"{as_json}: must be a JSON list of strings")
        return tokens
    if as_text.is_file():
        # One token per line. Not splitlines(): stand-in characters are never line breaks
        # to GPT-2, but some (U+0085 NEL...) are to Python. Token 50256 of the multilingual
        # vocabulary is the empty string, so an empty line is a token too.
        text = as_text.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [line.removesuffix("\r") for line in lines]
    if tokenizer.is_file():
        doc = json.loads(tokenizer.read_text(encoding="utf-8"))
        vocab: dict[str, int] = dict(doc["model"]["vocab"])
        for added in doc.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        by_id = sorted(vocab.items(), key=lambda item: item[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise Ct2FormatError(f"{tokenizer}: token ids are not 0..n-1")
        return [token for token, _ in by_id]
    raise Ct2FormatError(f"{ct2_dir}: no vocabulary.json, vocabulary.txt or tokenizer.json")
