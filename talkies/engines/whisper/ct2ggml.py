"""Convert a faster-whisper (CTranslate2) Whisper checkpoint into whisper.cpp's ggml file.

faster-whisper model folders hold ``model.bin`` (CTranslate2 binary format, spec
``WhisperSpec``), ``config.json`` and the vocabulary (``vocabulary.txt``, ``vocabulary.json`` or
``tokenizer.json``). whisper.cpp reads one legacy ggml file instead:

1. magic ``0x67676d6c`` and eleven int32 hparams (n_vocab, n_audio_ctx, n_audio_state,
   n_audio_head, n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels,
   ftype);
2. the mel filter bank: int32 n_mel, int32 n_fft (201), then n_mel x n_fft float32;
3. the byte-level BPE vocabulary up to (not including) ``<|endoftext|>``: int32 count, then
   int32 length + raw bytes per token. whisper.cpp numbers the special tokens itself, from
   hard-coded ids, so the checkpoint's specials must sit where it expects them;
4. the tensors: int32 n_dims, int32 name length, int32 type (0 f32, 1 f16), the dims
   innermost first, the name, the data. Matrices are f16 (in an f16 file); vectors,
   positional embeddings and the conv biases (stored as [n_state, 1]) are f32, which is what
   whisper.cpp allocates for them and checks byte for byte.

CTranslate2 fuses attention projections (self-attention q|k|v in one matrix, cross-attention
k|v), adds a zero bias for the bias-free key projection, may alias tied weights, and may store
int8/int16 weights with a ``weight_scale`` beside them: all of that is undone here. The mel
filters are not in the checkpoint: they are computed (librosa's Slaney mel, which is what
OpenAI's ``mel_filters.npz`` holds).

The CTranslate2 side is read by :mod:`talkies.engines.whisper.ct2`.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE
from .ct2 import Ct2Checkpoint, Ct2FormatError, read_vocabulary

__all__ = [
    "GGML_MAGIC",
    "QUANTIZATIONS",
    "Ct2Checkpoint",
    "Ct2FormatError",
    "Hparams",
    "byte_decoder",
    "convert",
    "ggml_tensor_shapes",
    "is_f32_tensor",
    "mel_filters",
    "quantize_q5_1",
    "quantize_q8_0",
    "read_vocabulary",
]

log = logging.getLogger("talkies.engines")

GGML_MAGIC = 0x67676D6C
N_FFT = 400
_EOT = "<|endoftext|>"
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/")

Array = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Hparams:
    """whisper.cpp's header, in file order."""

    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
    ftype: int  # 0: f32 matrices, 1: f16 matrices, QUANTIZATIONS' for quantized ones

    def pack(self) -> bytes:
        return struct.pack(
            "<11i",
            self.n_vocab,
            self.n_audio_ctx,
            self.n_audio_state,
            self.n_audio_head,
            self.n_audio_layer,
            self.n_text_ctx,
            self.n_text_state,
            self.n_text_head,
            self.n_text_layer,
            self.n_mels,
            self.ftype,
        )


def _count_layers(names: Iterator[str], stack: str) -> int:
    found = {int(m.group(2)) for n in names if (m := _LAYER.match(n)) and m.group(1) == stack}
    if found != set(range(len(found))):
        raise Ct2FormatError(f"{stack} layers are not numbered 0..n-1: {sorted(found)}")
    return len(found)


def _hparams(ckpt: Ct2Checkpoint, *, f16: bool) -> Hparams:
    if ckpt.spec != "WhisperSpec":
        raise Ct2FormatError(f"{ckpt.path}: spec {ckpt.spec!r} is not WhisperSpec")
    n_vocab, n_text_state = ckpt.shape("decoder/embeddings/weight")
    n_audio_ctx, n_audio_state = ckpt.shape("encoder/position_encodings/encodings")
    n_text_ctx, _ = ckpt.shape("decoder/position_encodings/encodings")
    n_mels = ckpt.shape("encoder/conv1/weight")[1]
    names = list(ckpt.variables) + list(ckpt.aliases)
    n_audio_layer = _count_layers(iter(names), "encoder")
    n_text_layer = _count_layers(iter(names), "decoder")

    def heads(stack: str, state: int) -> int:
        # Written by every WhisperSpec; CTranslate2's own default is 8 when absent.
        key = f"{stack}/num_heads"
        return ckpt.scalar(key) if ckpt.has(key) else max(1, state // 64)

    if n_audio_state != n_text_state:
        raise Ct2FormatError("whisper.cpp needs equal encoder and decoder widths")
    return Hparams(
        n_vocab=n_vocab,
        n_audio_ctx=n_audio_ctx,
        n_audio_state=n_audio_state,
        n_audio_head=heads("encoder", n_audio_state),
        n_audio_layer=n_audio_layer,
        n_text_ctx=n_text_ctx,
        n_text_state=n_text_state,
        n_text_head=heads("decoder", n_text_state),
        n_text_layer=n_text_layer,
        n_mels=n_mels,
        ftype=1 if f16 else 0,
    )


# -- mel filters ------------------------------------------------------------------------------


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Slaney's auditory toolbox scale: linear below 1 kHz, logarithmic above.
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, np.log(6.4) / 27.0
    mel = hz / f_sp
    log_part = hz >= min_log_hz
    mel[log_part] = min_log_mel + np.log(hz[log_part] / min_log_hz) / logstep
    return mel


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, np.log(6.4) / 27.0
    hz = mel * f_sp
    log_part = mel >= min_log_mel
    hz[log_part] = min_log_hz * np.exp(logstep * (mel[log_part] - min_log_mel))
    return hz


def mel_filters(n_mels: int, *, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> Array:
    """Triangular Slaney-scale filters with Slaney area normalisation, [n_mels, n_fft//2+1].

    Equal to ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)`` (htk=False,
    norm="slaney"), the bank OpenAI ships for Whisper.
    """
    fft_freqs = np.linspace(0.0, sample_rate / 2, 1 + n_fft // 2)
    mel_edges = np.linspace(
        _hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([sample_rate / 2]))[0], n_mels + 2
    )
    hz_edges = _mel_to_hz(mel_edges)
    widths = np.diff(hz_edges)
    ramps = hz_edges[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (hz_edges[2:] - hz_edges[:-2]))[:, None]
    return weights.astype(np.float32)


# -- vocabulary -------------------------------------------------------------------------------


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for raw bytes, inverted: stand-in character -> byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {char: b for b, char in table.items()}


def _vocabulary_bytes(tokens: Sequence[str], n_vocab: int) -> list[bytes]:
    """The BPE tokens before ``<|endoftext|>``, as raw bytes, checked against whisper.cpp's ids."""
    try:
        eot = tokens.index(_EOT)
    except ValueError:
        raise Ct2FormatError(f"the vocabulary has no {_EOT}") from None
    multilingual = n_vocab >= 51865
    expected = 50257 if multilingual else 50256
    if eot != expected:
        raise Ct2FormatError(
            f"{_EOT} has id {eot}, but whisper.cpp hard-codes {expected} for a "
            f"{'multilingual' if multilingual else 'English-only'} model (n_vocab {n_vocab})"
        )
    decoder = byte_decoder()
    out: list[bytes] = []
    for token in tokens[:eot]:
        try:
            out.append(bytes(decoder[c] for c in token))
        except KeyError:
            out.append(token.encode("utf-8"))  # not byte-level BPE text: keep it as it reads
    return out


# -- tensors ----------------------------------------------------------------------------------


def _split(array: Array, parts: int) -> list[Array]:
    if array.shape[0] % parts:
        raise Ct2FormatError(f"cannot split a fused projection of {array.shape[0]} rows")
    return list(np.split(array, parts, axis=0))


def _attention(
    ckpt: Ct2Checkpoint, src: str, dst: str, *, fused_qkv: bool
) -> Iterator[tuple[str, Array]]:
    """whisper.cpp's query/key/value/out from CTranslate2's fused linears (no key bias)."""
    if fused_qkv:
        q_w, k_w, v_w = _split(ckpt.tensor(f"{src}/linear_0/weight"), 3)
        q_b, _k_b, v_b = _split(ckpt.tensor(f"{src}/linear_0/bias"), 3)
        out = f"{src}/linear_1"
    else:
        q_w, q_b = ckpt.tensor(f"{src}/linear_0/weight"), ckpt.tensor(f"{src}/linear_0/bias")
        k_w, v_w = _split(ckpt.tensor(f"{src}/linear_1/weight"), 2)
        _k_b, v_b = _split(ckpt.tensor(f"{src}/linear_1/bias"), 2)
        out = f"{src}/linear_2"
    yield f"{dst}.query.weight", q_w
    yield f"{dst}.query.bias", q_b
    yield f"{dst}.key.weight", k_w
    yield f"{dst}.value.weight", v_w
    yield f"{dst}.value.bias", v_b
    yield f"{dst}.out.weight", ckpt.tensor(f"{out}/weight")
    yield f"{dst}.out.bias", ckpt.tensor(f"{out}/bias")


def _norm(ckpt: Ct2Checkpoint, src: str, dst: str) -> Iterator[tuple[str, Array]]:
    yield f"{dst}.weight", ckpt.tensor(f"{src}/gamma")
    yield f"{dst}.bias", ckpt.tensor(f"{src}/beta")


def _ffn(ckpt: Ct2Checkpoint, src: str, dst: str) -> Iterator[tuple[str, Array]]:
    yield from _norm(ckpt, f"{src}/layer_norm", f"{dst}.mlp_ln")
    for i, j in ((0, 0), (1, 2)):
        yield f"{dst}.mlp.{j}.weight", ckpt.tensor(f"{src}/linear_{i}/weight")
        yield f"{dst}.mlp.{j}.bias", ckpt.tensor(f"{src}/linear_{i}/bias")


def _tensors(ckpt: Ct2Checkpoint, hp: Hparams) -> Iterator[tuple[str, Array]]:
    """(whisper.cpp name, float32 data) for every tensor whisper.cpp loads."""
    yield "encoder.positional_embedding", ckpt.tensor("encoder/position_encodings/encodings")
    for conv in ("conv1", "conv2"):
        yield f"encoder.{conv}.weight", ckpt.tensor(f"encoder/{conv}/weight")
        # whisper.cpp allocates the conv biases as [n_state, 1] (ne = {1, n_state}).
        yield f"encoder.{conv}.bias", ckpt.tensor(f"encoder/{conv}/bias").reshape(-1, 1)
    for i in range(hp.n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        yield from _norm(ckpt, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
        yield from _attention(ckpt, f"{src}/self_attention", f"{dst}.attn", fused_qkv=True)
        yield from _ffn(ckpt, f"{src}/ffn", dst)
    yield from _norm(ckpt, "encoder/layer_norm", "encoder.ln_post")

    yield "decoder.positional_embedding", ckpt.tensor("decoder/position_encodings/encodings")
    # The output projection is tied to the token embedding in Whisper (CTranslate2 aliases
    # decoder/projection/weight to it); whisper.cpp reuses the embedding, so it is not written.
    yield "decoder.token_embedding.weight", ckpt.tensor("decoder/embeddings/weight")
    for i in range(hp.n_text_layer):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        yield from _norm(ckpt, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
        yield from _attention(ckpt, f"{src}/self_attention", f"{dst}.attn", fused_qkv=True)
        yield from _norm(ckpt, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln")
        yield from _attention(ckpt, f"{src}/attention", f"{dst}.cross_attn", fused_qkv=False)
        yield from _ffn(ckpt, f"{src}/ffn", dst)
    yield from _norm(ckpt, "decoder/layer_norm", "decoder.ln")


def ggml_tensor_shapes(hp: Hparams) -> dict[str, tuple[int, ...]]:
    """Every tensor whisper.cpp loads for these hparams, with its shape (outermost first)."""
    d, d_text = hp.n_audio_state, hp.n_text_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.positional_embedding": (hp.n_audio_ctx, d),
        "encoder.conv1.weight": (d, hp.n_mels, 3),
        "encoder.conv1.bias": (d, 1),
        "encoder.conv2.weight": (d, d, 3),
        "encoder.conv2.bias": (d, 1),
        "encoder.ln_post.weight": (d,),
        "encoder.ln_post.bias": (d,),
        "decoder.positional_embedding": (hp.n_text_ctx, d_text),
        "decoder.token_embedding.weight": (hp.n_vocab, d_text),
        "decoder.ln.weight": (d_text,),
        "decoder.ln.bias": (d_text,),
    }

    def block(prefix: str, width: int, cross: bool) -> None:
        kinds = ["attn", "cross_attn"] if cross else ["attn"]
        for kind in kinds:
            shapes[f"{prefix}.{kind}_ln.weight"] = (width,)
            shapes[f"{prefix}.{kind}_ln.bias"] = (width,)
            for proj in ("query", "key", "value", "out"):
                shapes[f"{prefix}.{kind}.{proj}.weight"] = (width, width)
                if proj != "key":
                    shapes[f"{prefix}.{kind}.{proj}.bias"] = (width,)
        shapes[f"{prefix}.mlp_ln.weight"] = (width,)
        shapes[f"{prefix}.mlp_ln.bias"] = (width,)
        shapes[f"{prefix}.mlp.0.weight"] = (4 * width, width)
        shapes[f"{prefix}.mlp.0.bias"] = (4 * width,)
        shapes[f"{prefix}.mlp.2.weight"] = (width, 4 * width)
        shapes[f"{prefix}.mlp.2.bias"] = (width,)

    for i in range(hp.n_audio_layer):
        block(f"encoder.blocks.{i}", d, cross=False)
    for i in range(hp.n_text_layer):
        block(f"decoder.blocks.{i}", d_text, cross=True)
    return shapes


def is_f32_tensor(name: str, ndim: int) -> bool:
    """Tensors whisper.cpp keeps in f32 whatever the file's ftype."""
    return ndim < 2 or name.endswith(("conv1.bias", "conv2.bias", "positional_embedding"))


# Quantized matrices, as whisper.cpp's own ``quantize`` tool writes them: name -> (ggml type
# id, the file's ftype: ggml's "mostly" ftype + 1000 x its quantization version 2).
QUANTIZATIONS: dict[str, tuple[int, int]] = {"q8_0": (8, 2007), "q5_1": (7, 2009)}
_QK = 32  # values per block of both types


def quantize_q8_0(rows: Array) -> bytes:
    """ggml's ``quantize_row_q8_0_ref``: per 32 values an f16 scale (max |x| / 127) and 32
    int8 values."""
    blocks = rows.astype(np.float32).reshape(-1, _QK)
    scale = np.abs(blocks).max(axis=1) / 127.0
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    scaled = blocks * inverse[:, None]
    quants = np.trunc(scaled + np.copysign(0.5, scaled)).astype(np.int8)  # C's roundf
    out = np.zeros(blocks.shape[0], dtype=[("d", "<f2"), ("qs", "i1", _QK)])
    out["d"] = scale
    out["qs"] = quants
    return out.tobytes()


def quantize_q5_1(rows: Array) -> bytes:
    """ggml's ``quantize_row_q5_1_ref``: per 32 values an f16 step and minimum, then 5-bit
    steps: the high bits in a uint32, the low nibbles two to a byte (value j with j + 16)."""
    blocks = rows.astype(np.float32).reshape(-1, _QK)
    low, high = blocks.min(axis=1), blocks.max(axis=1)
    step = (high - low) / 31.0
    inverse = np.divide(1.0, step, out=np.zeros_like(step), where=step != 0)
    levels = ((blocks - low[:, None]) * inverse[:, None] + 0.5).astype(np.uint8)
    first, second = levels[:, :16], levels[:, 16:]
    nibbles = (first & 0x0F) | ((second & 0x0F) << 4)
    bits = np.arange(16, dtype=np.uint32)
    qh = (((first >> 4) & 1).astype(np.uint32) << bits).sum(axis=1, dtype=np.uint32)
    qh |= (((second >> 4) & 1).astype(np.uint32) << (bits + 16)).sum(axis=1, dtype=np.uint32)
    out = np.zeros(
        blocks.shape[0], dtype=[("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]
    )
    out["d"], out["m"], out["qh"], out["qs"] = step, low, qh, nibbles
    return out.tobytes()


_QUANTIZERS = {"q8_0": quantize_q8_0, "q5_1": quantize_q5_1}


def _write_tensor(
    out: BinaryIO, name: str, array: Array, *, f16: bool, quant: str | None = None
) -> None:
    keep_f32 = is_f32_tensor(name, array.ndim)
    encoded = name.encode("utf-8")
    if quant is not None and not keep_f32 and array.ndim == 2 and array.shape[-1] % _QK == 0:
        # Matrices only, as whisper.cpp's quantize does (the 3-D conv kernels stay f16).
        ttype, _ = QUANTIZATIONS[quant]
        out.write(struct.pack("<3i", array.ndim, len(encoded), ttype))
        out.write(struct.pack(f"<{array.ndim}i", *reversed(array.shape)))
        out.write(encoded)
        out.write(_QUANTIZERS[quant](np.ascontiguousarray(array, dtype=np.float32)))
        return
    half = (f16 or quant is not None) and not keep_f32
    data = np.ascontiguousarray(array, dtype="<f2" if half else "<f4")
    out.write(struct.pack("<3i", data.ndim, len(encoded), 1 if half else 0))
    out.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
    out.write(encoded)
    out.write(data.tobytes())


def convert(
    ct2_dir: Path, out_file: Path, *, f16: bool = True, quant: str | None = None
) -> Hparams:
    """Write ``out_file`` (whisper.cpp ggml) from the CTranslate2 Whisper folder ``ct2_dir``.

    The file is written beside its destination and renamed into place, so a reader never
    sees half a model. Returns the header written. ``quant`` (a key of
    :data:`QUANTIZATIONS`) stores the matrices quantized, the rest as an f16 file would.
    """
    ct2_dir, out_file = Path(ct2_dir), Path(out_file)
    if quant is not None and quant not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    tokens = read_vocabulary(ct2_dir)
    with Ct2Checkpoint(ct2_dir / "model.bin") as ckpt:
        hp = _hparams(ckpt, f16=f16)
        if quant is not None:
            hp = replace(hp, ftype=QUANTIZATIONS[quant][1])
        if len(tokens) != hp.n_vocab:
            raise Ct2FormatError(
                f"the vocabulary has {len(tokens)} tokens but the embedding {hp.n_vocab} rows"
            )
        vocab = _vocabulary_bytes(tokens, hp.n_vocab)
        filters = mel_filters(hp.n_mels)
        partial = out_file.with_name(out_file.name + ".partial")
        try:
            with partial.open("wb") as out:
                out.write(struct.pack("<I", GGML_MAGIC))
                out.write(hp.pack())
                out.write(struct.pack("<2i", *filters.shape))
                out.write(filters.astype("<f4").tobytes())
                out.write(struct.pack("<i", len(vocab)))
                for token in vocab:
                    out.write(struct.pack("<i", len(token)))
                    out.write(token)
                expected = ggml_tensor_shapes(hp)
                count = 0
                for name, array in _tensors(ckpt, hp):
                    if expected.pop(name, None) != array.shape:
                        raise Ct2FormatError(
                            f"tensor {name!r} has shape {array.shape}, whisper.cpp expects "
                            f"{ggml_tensor_shapes(hp).get(name)}"
                        )
                    _write_tensor(out, name, array, f16=f16, quant=quant)
                    count += 1
                if expected:
                    raise Ct2FormatError(f"tensors not produced: {sorted(expected)[:5]}")
            partial.replace(out_file)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    log.info("converted %s to %s: %d tensors, %s", ct2_dir, out_file, count, hp)
    return hp


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m talkies.engines.whisper.ct2ggml CT2_DIR OUT.bin [--f32]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("ct2_dir", type=Path, help="faster-whisper / CTranslate2 model folder")
    parser.add_argument("out_file", type=Path, help="whisper.cpp ggml file to write")
    parser.add_argument("--f32", action="store_true", help="keep every tensor in float32")
    parser.add_argument("--quant", choices=sorted(QUANTIZATIONS), help="quantize the matrices")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        convert(args.ct2_dir, args.out_file, f16=not args.f32, quant=args.quant)
    except (Ct2FormatError, OSError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
