"""whisper.cpp model files: finding an entry's, checking it from end to end before
whisper.cpp reads it (:func:`inspect_ggml`), converting a faster-whisper folder once."""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from ..base import EngineUnavailable
from ..supply.entry import ModelEntry
from .config import RollingConfig
from .ct2ggml import GGML_MAGIC, Ct2FormatError, Hparams, convert, ggml_tensor_shapes

__all__ = ["GgmlInfo", "ggml_for", "inspect_ggml", "model_path"]

log = logging.getLogger("talkies.engines")

# ggml type id -> (block size, bytes per block), for the types whisper.cpp files use.
_GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # f32
    1: (1, 2),  # f16
    2: (32, 18),  # q4_0
    3: (32, 20),  # q4_1
    6: (32, 22),  # q5_0
    7: (32, 24),  # q5_1
    8: (32, 34),  # q8_0
    10: (256, 84),  # q2_K
    11: (256, 110),  # q3_K
    12: (256, 144),  # q4_K
    13: (256, 176),  # q5_K
    14: (256, 210),  # q6_K
}
_MAX_TOKEN_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class GgmlInfo:
    """What :func:`inspect_ggml` found in a whisper.cpp model file."""

    hparams: Hparams
    n_mel_filters: int
    n_fft: int
    n_tokens: int  # vocabulary entries stored (the specials are whisper.cpp's own)
    tensors: dict[str, tuple[tuple[int, ...], int]]  # name -> (shape outermost first, type)

    @property
    def multilingual(self) -> bool:
        return self.hparams.n_vocab >= 51865


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("rb")
        self.size = path.stat().st_size

    def ints(self, count: int) -> tuple[int, ...]:
        raw = self.file.read(4 * count)
        if len(raw) != 4 * count:
            raise ValueError(f"{self.path}: truncated at byte {self.file.tell()}")
        return struct.unpack(f"<{count}i", raw)

    def skip(self, count: int) -> None:
        if count < 0 or self.file.tell() + count > self.size:
            raise ValueError(f"{self.path}: truncated at byte {self.file.tell()}")
        self.file.seek(count, 1)


def inspect_ggml(path: Path) -> GgmlInfo:
    """Check a whisper.cpp ggml file from end to end without loading its weights.

    whisper.cpp reports a malformed file only through its log and hands back an unusable
    context, so every field it will read is checked here first: header, filters, vocabulary,
    and each tensor's name, shape and byte count against what whisper.cpp allocates.
    """
    reader = _Reader(path)
    try:
        (magic,) = struct.unpack("<I", struct.pack("<i", reader.ints(1)[0]))
        if magic != GGML_MAGIC:
            raise ValueError(f"{path}: not a whisper.cpp ggml model (magic {magic:#x})")
        hp = Hparams(*reader.ints(11))
        sizes = [hp.n_vocab, hp.n_audio_ctx, hp.n_audio_state, hp.n_audio_head, hp.n_text_ctx]
        sizes += [hp.n_text_state, hp.n_text_head, hp.n_mels]
        if min(sizes) <= 0 or min(hp.n_audio_layer, hp.n_text_layer) < 0:
            raise ValueError(f"{path}: impossible hparams {hp}")
        if hp.n_vocab < 51864:
            raise ValueError(
                f"{path}: n_vocab {hp.n_vocab} < 51864; whisper.cpp hard-codes its special "
                "token ids and needs at least that many"
            )
        if hp.n_audio_state != hp.n_text_state:
            raise ValueError(f"{path}: encoder and decoder widths differ")
        n_mel, n_fft = reader.ints(2)
        if not (0 < n_mel <= 512 and 0 < n_fft <= 4096):
            raise ValueError(f"{path}: bad mel filter bank {n_mel}x{n_fft}")
        reader.skip(4 * n_mel * n_fft)
        (n_tokens,) = reader.ints(1)
        if not 0 <= n_tokens <= hp.n_vocab:
            raise ValueError(f"{path}: {n_tokens} vocabulary entries for n_vocab {hp.n_vocab}")
        for _ in range(n_tokens):
            (length,) = reader.ints(1)
            if not 0 <= length <= _MAX_TOKEN_BYTES:
                raise ValueError(f"{path}: bad token length {length}")
            reader.skip(length)
        expected = ggml_tensor_shapes(hp)
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        while reader.file.tell() < reader.size:
            n_dims, name_len, ttype = reader.ints(3)
            if not (1 <= n_dims <= 4 and 0 < name_len <= 256):
                raise ValueError(f"{path}: bad tensor header at byte {reader.file.tell() - 12}")
            dims = reader.ints(n_dims)
            name = reader.file.read(name_len).decode("utf-8", "replace")
            shape = tuple(reversed(dims))
            if name not in expected or name in tensors:
                raise ValueError(f"{path}: unexpected or repeated tensor {name!r}")
            if shape != expected[name]:
                raise ValueError(
                    f"{path}: tensor {name!r} has shape {shape}, want {expected[name]}"
                )
            if ttype not in _GGML_TYPES:
                raise ValueError(f"{path}: tensor {name!r} has unsupported ggml type {ttype}")
            block, size = _GGML_TYPES[ttype]
            count = math.prod(shape)
            if count % block:
                raise ValueError(f"{path}: tensor {name!r} does not fill its blocks")
            reader.skip(count // block * size)
            tensors[name] = (shape, ttype)
        missing = set(expected) - set(tensors)
        if missing:
            raise ValueError(f"{path}: {len(missing)} tensors missing, e.g. {sorted(missing)[0]!r}")
        return GgmlInfo(hp, n_mel, n_fft, n_tokens, tensors)
    except struct.error as exc:
        raise ValueError(f"{path}: truncated") from exc
    finally:
        reader.file.close()


_CONVERTED_SUFFIX = ".ggml.bin"


def model_path(entry: ModelEntry, root: Path, config: RollingConfig) -> Path:
    """The model file: ``options.model_file``, else ``model.bin``, else the one ``*.bin``."""
    if config.model_file is not None:
        path = (root / config.model_file).resolve()
        if not path.is_relative_to(root.resolve()):
            raise EngineUnavailable(f"model {entry.slug!r}: model_file must stay inside the model")
        if not path.is_file():
            raise EngineUnavailable(f"model {entry.slug!r}: {config.model_file} not found")
        return path
    if (root / "model.bin").is_file():
        return root / "model.bin"
    candidates = sorted(
        p for p in root.glob("*.bin") if p.is_file() and not p.name.endswith(_CONVERTED_SUFFIX)
    )
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise EngineUnavailable(f"model {entry.slug!r}: no whisper.cpp .bin file in the model")
    raise EngineUnavailable(
        f"model {entry.slug!r}: several .bin files; name one in options.model_file"
    )


def _is_ggml(path: Path) -> bool:
    with path.open("rb") as file:
        head = file.read(4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == GGML_MAGIC


def ggml_for(entry: ModelEntry, path: Path) -> Path:
    """``path``, or for a faster-whisper (CTranslate2) folder its ggml conversion.

    The conversion (about 1.5 s for base) is written once beside the checkpoint as
    ``<name>.ggml.bin`` and reused while it is newer than the checkpoint.
    """
    if _is_ggml(path) or not (path.parent / "config.json").is_file():
        return path
    converted = path.with_name(path.stem + _CONVERTED_SUFFIX)
    if converted.is_file() and converted.stat().st_mtime >= path.stat().st_mtime:
        return converted
    try:
        convert(path.parent, converted)
    except (Ct2FormatError, OSError) as exc:
        raise EngineUnavailable(
            f"model {entry.slug!r}: {path.name} is neither a whisper.cpp model nor a "
            f"convertible CTranslate2 Whisper checkpoint: {exc}"
        ) from None
    log.info("model %r: converted the CTranslate2 checkpoint to %s", entry.slug, converted)
    return converted
