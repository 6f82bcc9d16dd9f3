"""Tiny random Whisper models, numpy only: a whisper.cpp ggml file and a CTranslate2 folder.

The ggml writer here is independent of ``talkies.engines.whisper.ct2ggml`` on purpose: the converter
is tested by converting a CTranslate2 folder written below and comparing what comes out with
the weights that went in. At width 32 with one layer a side the ggml file is about 4 MB, most
of it the token embedding: whisper.cpp hard-codes its special token ids (end-of-text 50256 or
50257), so the vocabulary cannot shrink below 51864 entries.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from talkies.engines.whisper.ct2ggml import mel_filters

__all__ = [
    "TINY",
    "GgmlFile",
    "TinySpec",
    "base_folder",
    "converted_base",
    "read_ggml",
    "vocabulary_strings",
    "whisper_weights",
    "write_ct2",
    "write_ggml",
]

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class TinySpec:
    width: int = 32
    heads: int = 2
    encoder_layers: int = 1
    decoder_layers: int = 1
    n_vocab: int = 51864  # English-only layout; 51865 is the multilingual one
    n_audio_ctx: int = 1500
    n_text_ctx: int = 448
    n_mels: int = 80

    @property
    def eot(self) -> int:
        return 50257 if self.n_vocab >= 51865 else 50256


TINY = TinySpec()


def whisper_weights(spec: TinySpec = TINY, seed: int = 0) -> dict[str, Array]:
    """Random float32 weights under whisper.cpp's (OpenAI's) names; conv biases are 1-D."""
    rng = np.random.default_rng(seed)
    d = spec.width

    def rand(*shape: int, scale: float = 0.2) -> Array:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out: dict[str, Array] = {
        "encoder.positional_embedding": rand(spec.n_audio_ctx, d, scale=0.1),
        "encoder.conv1.weight": rand(d, spec.n_mels, 3),
        "encoder.conv1.bias": rand(d, scale=0.02),
        "encoder.conv2.weight": rand(d, d, 3),
        "encoder.conv2.bias": rand(d, scale=0.02),
        "encoder.ln_post.weight": 1 + rand(d, scale=0.05),
        "encoder.ln_post.bias": rand(d, scale=0.02),
        "decoder.positional_embedding": rand(spec.n_text_ctx, d, scale=0.1),
        "decoder.token_embedding.weight": rand(spec.n_vocab, d, scale=0.5),
        "decoder.ln.weight": 1 + rand(d, scale=0.05),
        "decoder.ln.bias": rand(d, scale=0.02),
    }

    def block(prefix: str, cross: bool) -> None:
        for kind in ("attn", "cross_attn") if cross else ("attn",):
            out[f"{prefix}.{kind}_ln.weight"] = 1 + rand(d, scale=0.05)
            out[f"{prefix}.{kind}_ln.bias"] = rand(d, scale=0.02)
            for proj in ("query", "key", "value", "out"):
                out[f"{prefix}.{kind}.{proj}.weight"] = rand(d, d)
                if proj != "key":
                    out[f"{prefix}.{kind}.{proj}.bias"] = rand(d, scale=0.02)
        out[f"{prefix}.mlp_ln.weight"] = 1 + rand(d, scale=0.05)
        out[f"{prefix}.mlp_ln.bias"] = rand(d, scale=0.02)
        out[f"{prefix}.mlp.0.weight"] = rand(4 * d, d)
        out[f"{prefix}.mlp.0.bias"] = rand(4 * d, scale=0.02)
        out[f"{prefix}.mlp.2.weight"] = rand(d, 4 * d)
        out[f"{prefix}.mlp.2.bias"] = rand(d, scale=0.02)

    for i in range(spec.encoder_layers):
        block(f"encoder.blocks.{i}", cross=False)
    for i in range(spec.decoder_layers):
        block(f"decoder.blocks.{i}", cross=True)
    return out


# -- vocabulary -------------------------------------------------------------------------------


def _gpt2_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value 0..255."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _token_bytes(spec: TinySpec) -> list[bytes]:
    """The regular tokens: the 256 bytes, then ' t<id>' words; an empty token at 50256 when
    multilingual (as in OpenAI's vocabulary)."""
    tokens = [bytes([b]) for b in range(256)]
    tokens += [b" t%d" % i for i in range(256, 50256)]
    if spec.eot == 50257:
        tokens.append(b"")
    return tokens


def vocabulary_strings(spec: TinySpec = TINY) -> list[str]:
    """The full CTranslate2 vocabulary (GPT-2 stand-in characters, then the specials)."""
    chars = _gpt2_chars()
    regular = ["".join(chars[b] for b in token) for token in _token_bytes(spec)]
    specials = ["<|endoftext|>", "<|startoftranscript|>"]
    specials += [f"<|lang{i}|>" for i in range(spec.n_vocab - spec.eot - 2 - 1501 - 6)]
    specials += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>"]
    specials += ["<|nocaptions|>", "<|notimestamps|>"]
    specials += [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokens = regular + specials
    assert len(tokens) == spec.n_vocab, len(tokens)
    return tokens


# -- ggml -------------------------------------------------------------------------------------


def _f32(name: str, array: Array) -> bool:
    return array.ndim < 2 or name.endswith(("conv1.bias", "conv2.bias", "positional_embedding"))


def write_ggml(path: Path, spec: TinySpec = TINY, seed: int = 0) -> Path:
    """A whisper.cpp model file with random weights (f16 matrices)."""
    weights = whisper_weights(spec, seed)
    tokens = _token_bytes(spec)
    filters = mel_filters(spec.n_mels)
    with path.open("wb") as out:
        out.write(struct.pack("<I", 0x67676D6C))
        out.write(
            struct.pack(
                "<11i",
                spec.n_vocab,
                spec.n_audio_ctx,
                spec.width,
                spec.heads,
                spec.encoder_layers,
                spec.n_text_ctx,
                spec.width,
                spec.heads,
                spec.decoder_layers,
                spec.n_mels,
                1,
            )
        )
        out.write(struct.pack("<2i", *filters.shape))
        out.write(filters.astype("<f4").tobytes())
        out.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            out.write(struct.pack("<i", len(token)) + token)
        for name, weight in weights.items():
            array = weight.reshape(-1, 1) if name.endswith(("conv1.bias", "conv2.bias")) else weight
            f32 = _f32(name, array)
            data = array.astype("<f4" if f32 else "<f2")
            encoded = name.encode()
            out.write(struct.pack("<3i", data.ndim, len(encoded), 0 if f32 else 1))
            out.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            out.write(encoded + data.tobytes())
    return path


@dataclass
class GgmlFile:
    hparams: tuple[int, ...]
    filters: Array
    tokens: list[bytes]
    tensors: dict[str, tuple[np.ndarray, int]]  # name -> (data, ggml type)


def read_ggml(path: Path) -> GgmlFile:
    """Parse a whisper.cpp ggml file with f32/f16 tensors (for tests)."""
    data = path.read_bytes()
    pos = 0

    def ints(n: int) -> tuple[int, ...]:
        nonlocal pos
        values = struct.unpack_from(f"<{n}i", data, pos)
        pos += 4 * n
        return values

    (magic,) = struct.unpack_from("<I", data, 0)
    assert magic == 0x67676D6C
    pos = 4
    hparams = ints(11)
    n_mel, n_fft = ints(2)
    filters = np.frombuffer(data, "<f4", n_mel * n_fft, pos).reshape(n_mel, n_fft)
    pos += 4 * n_mel * n_fft
    tokens = []
    for _ in range(ints(1)[0]):
        (length,) = ints(1)
        tokens.append(data[pos : pos + length])
        pos += length
    tensors: dict[str, tuple[np.ndarray, int]] = {}
    while pos < len(data):
        n_dims, name_len, ttype = ints(3)
        dims = ints(n_dims)
        name = data[pos : pos + name_len].decode()
        pos += name_len
        shape = tuple(reversed(dims))
        dtype = "<f4" if ttype == 0 else "<f2"
        count = int(np.prod(shape))
        tensors[name] = (np.frombuffer(data, dtype, count, pos).reshape(shape), ttype)
        pos += count * np.dtype(dtype).itemsize
    return GgmlFile(hparams, filters, tokens, tensors)


# -- CTranslate2 ------------------------------------------------------------------------------

_CT2_TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}


def _ct2_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def write_ct2(
    folder: Path,
    spec: TinySpec = TINY,
    seed: int = 0,
    *,
    quantization: str | None = None,
    vocabulary: str = "txt",
) -> dict[str, Array]:
    """A CTranslate2 ``WhisperSpec`` folder (model.bin v6, config.json, vocabulary).

    Laid out as CTranslate2's Whisper converter does: fused q|k|v (zero key bias) and k|v
    linears, layer norms as gamma/beta, scalar attributes, the projection aliased to the
    embedding. ``quantization="int8"`` stores the linear weights as int8 with per-row scales.
    Returns the weights it encodes (whisper.cpp names), for comparison after conversion.
    """
    folder.mkdir(parents=True, exist_ok=True)
    w = whisper_weights(spec, seed)
    d = spec.width
    zeros = np.zeros(d, np.float32)
    variables: dict[str, np.ndarray] = {
        "encoder/num_heads": np.array(spec.heads, np.int16),
        "decoder/num_heads": np.array(spec.heads, np.int16),
        "decoder/activation": np.array(3, np.int8),
        "decoder/pre_norm": np.array(1, np.int8),
        "decoder/scale_embeddings": np.array(0, np.int8),
        "encoder/conv1/weight": w["encoder.conv1.weight"],
        "encoder/conv1/bias": w["encoder.conv1.bias"],
        "encoder/conv2/weight": w["encoder.conv2.weight"],
        "encoder/conv2/bias": w["encoder.conv2.bias"],
        "encoder/position_encodings/encodings": w["encoder.positional_embedding"],
        "encoder/layer_norm/gamma": w["encoder.ln_post.weight"],
        "encoder/layer_norm/beta": w["encoder.ln_post.bias"],
        "decoder/embeddings/weight": w["decoder.token_embedding.weight"],
        "decoder/position_encodings/encodings": w["decoder.positional_embedding"],
        "decoder/layer_norm/gamma": w["decoder.ln.weight"],
        "decoder/layer_norm/beta": w["decoder.ln.bias"],
    }

    def norm(src: str, dst: str) -> None:
        variables[f"{dst}/gamma"] = w[f"{src}.weight"]
        variables[f"{dst}/beta"] = w[f"{src}.bias"]

    def linear(dst: str, weight: Array, bias: Array) -> None:
        variables[f"{dst}/weight"] = weight
        variables[f"{dst}/bias"] = bias

    def layer(src: str, dst: str, cross: bool) -> None:
        a = f"{src}.attn"
        norm(f"{src}.attn_ln", f"{dst}/self_attention/layer_norm")
        linear(
            f"{dst}/self_attention/linear_0",
            np.concatenate([w[f"{a}.query.weight"], w[f"{a}.key.weight"], w[f"{a}.value.weight"]]),
            np.concatenate([w[f"{a}.query.bias"], zeros, w[f"{a}.value.bias"]]),
        )
        linear(f"{dst}/self_attention/linear_1", w[f"{a}.out.weight"], w[f"{a}.out.bias"])
        if cross:
            c = f"{src}.cross_attn"
            norm(f"{src}.cross_attn_ln", f"{dst}/attention/layer_norm")
            linear(f"{dst}/attention/linear_0", w[f"{c}.query.weight"], w[f"{c}.query.bias"])
            linear(
                f"{dst}/attention/linear_1",
                np.concatenate([w[f"{c}.key.weight"], w[f"{c}.value.weight"]]),
                np.concatenate([zeros, w[f"{c}.value.bias"]]),
            )
            linear(f"{dst}/attention/linear_2", w[f"{c}.out.weight"], w[f"{c}.out.bias"])
        norm(f"{src}.mlp_ln", f"{dst}/ffn/layer_norm")
        linear(f"{dst}/ffn/linear_0", w[f"{src}.mlp.0.weight"], w[f"{src}.mlp.0.bias"])
        linear(f"{dst}/ffn/linear_1", w[f"{src}.mlp.2.weight"], w[f"{src}.mlp.2.bias"])

    for i in range(spec.encoder_layers):
        layer(f"encoder.blocks.{i}", f"encoder/layer_{i}", cross=False)
    for i in range(spec.decoder_layers):
        layer(f"decoder.blocks.{i}", f"decoder/layer_{i}", cross=True)

    stored: dict[str, np.ndarray] = {}
    for name, value in variables.items():
        if value.dtype != np.float32:
            stored[name] = value
        elif quantization == "int8" and "/linear_" in name and name.endswith("/weight"):
            amax = np.abs(value).max(axis=1)
            amax[amax == 0] = 127.0
            scale = (127.0 / amax).astype(np.float32)
            stored[name] = np.rint(value * scale[:, None]).astype(np.int8)
            stored[name + "_scale"] = scale
        else:
            stored[name] = value.astype(np.float16)

    with (folder / "model.bin").open("wb") as out:
        out.write(struct.pack("<I", 6) + _ct2_string("WhisperSpec") + struct.pack("<I", 3))
        out.write(struct.pack("<I", len(stored)))
        for name in sorted(stored):
            value = stored[name]
            out.write(_ct2_string(name) + struct.pack("<B", value.ndim))
            out.write(struct.pack(f"<{value.ndim}I", *value.shape))
            out.write(struct.pack("<BI", _CT2_TYPE_IDS[str(value.dtype)], value.nbytes))
            out.write(value.astype(value.dtype.newbyteorder("<")).tobytes())
        out.write(struct.pack("<I", 1))
        out.write(_ct2_string("decoder/projection/weight"))
        out.write(_ct2_string("decoder/embeddings/weight"))
    config = {"suppress_ids": [], "suppress_ids_begin": [220, spec.eot], "lang_ids": []}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tokens = vocabulary_strings(spec)
    if vocabulary == "txt":
        text = "\n".join(tokens) + "\n"
        (folder / "vocabulary.txt").write_text(text, encoding="utf-8")
    elif vocabulary == "json":
        (folder / "vocabulary.json").write_text(json.dumps(tokens), encoding="utf-8")
    else:
        vocab = {t: i for i, t in enumerate(tokens[: spec.eot])}
        added = [{"id": i, "content": t} for i, t in enumerate(tokens) if i >= spec.eot]
        doc = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": added}
        (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    return w


# -- the real Whisper base model and real speech ----------------------------------------------

POCKETSPHINX_DATA = Path("/usr/share/pocketsphinx/test/data")  # Debian pocketsphinx-testdata


def converted_base(root: Path) -> Path | None:
    """Whisper base (multilingual) as ggml: the built-in ``whisper-base-en-cpp`` entry's own
    preparation (join the wheels' parts, verify, convert) with ``root`` as the data dir.

    Prepared once per ``root`` (a session's base temp dir); None when the wheels are absent.
    """
    return _prepared_base(root, "whisper-base-en-cpp")


def base_folder(root: Path) -> Path | None:
    """Whisper base as the default ``whisper-base-en`` runs it (CTranslate2): the wheels'
    faster-whisper folder, joined and verified, with ``root`` as the data dir; the folder,
    or None when the wheels are absent."""
    model = _prepared_base(root, "whisper-base-en")
    return None if model is None else model.parent


def _prepared_base(root: Path, slug: str) -> Path | None:
    from importlib import metadata

    from talkies.engines.supply.builtin import BUILTIN_MODELS
    from talkies.engines.supply.download import ensure_snapshot

    entry = BUILTIN_MODELS[slug]
    assert entry.wheels is not None
    try:
        for wheel_file in entry.wheels:
            for dist, _ in wheel_file.parts:
                metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    return ensure_snapshot(entry, root) / "model.bin"


@dataclass(frozen=True)
class Clip:
    name: str
    pcm: bytes  # s16le mono 16 kHz
    reference: str

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 32000


def speech_clips() -> list[Clip]:
    """goforward.raw, the LibriVox clips, and the LibriVox clips joined into one long clip."""
    import re
    import wave

    root = POCKETSPHINX_DATA
    if not (root / "goforward.raw").is_file():
        return []
    clips = [Clip("goforward", (root / "goforward.raw").read_bytes(), "go forward ten meters")]
    refs: dict[str, str] = {}
    for line in (root / "librivox" / "transcription").read_text().splitlines():
        match = re.fullmatch(r"<s> (.*) </s> \((.*)\)", line.strip())
        if match:
            refs[match.group(2)] = match.group(1)
    librivox = []
    for path in sorted((root / "librivox").glob("*.wav")):
        with wave.open(str(path)) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
            librivox.append(Clip(path.stem[-4:], wav.readframes(wav.getnframes()), refs[path.stem]))
    joined = Clip(
        "librivox-joined",
        b"".join(c.pcm for c in librivox),
        " ".join(c.reference for c in librivox),
    )
    return [*clips, *librivox, joined]


_SPOKEN = {"mr": "mister", "mrs": "missus", "10": "ten"}


def normalize_words(text: str) -> list[str]:
    """Lower case, hyphens as spaces, no punctuation; the few written forms in these clips
    spelled out as the references spell them."""
    import re

    text = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " "))
    return [_SPOKEN.get(w, w) for w in text.split()]


def word_errors(hypothesis: str, reference: str) -> tuple[int, int]:
    """(edit distance in words, reference length) after :func:`normalize_words`."""
    hyp, ref = normalize_words(hypothesis), normalize_words(reference)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[len(hyp)], len(ref)
