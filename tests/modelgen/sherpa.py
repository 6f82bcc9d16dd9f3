"""Random-weight sherpa-onnx streaming models, built with ``onnx.helper`` and numpy only.

No model hub is reachable, so the tests and benches run the real sherpa-onnx runtime on
generated models with the exact input/output layout and metadata it expects
(see ``/work/shared/research/test-models.md``):

- :func:`lstm_transducer`: an icefall-style LSTM transducer (``model_type=lstm``:
  encoder/decoder/joiner + ``tokens.txt``) for ``OnlineRecognizer.from_transducer``. It
  runs a real multi-layer ONNX ``LSTM`` on 4x-subsampled fbank frames, so its compute cost
  scales like a real model's: ``tiny`` widths for tests, :data:`PRODUCTION` widths for
  benchmarks. One encoder channel is an energy gate that pushes the joiner towards blank on
  silence, so the model stays quiet in silence and produces endpoints in trailing silence,
  and emits (random) tokens on speech.
- :func:`wenet_ctc`: a WeNet-style chunked CTC model (``model.onnx`` + ``tokens.txt``) for
  ``OnlineRecognizer.from_wenet_ctc``; its output is random, so it seldom endpoints.

Both are deterministic for a given seed and widths, and return a ``sherpa_config`` whose file
names are relative to the output directory (what ``ModelEntry.sherpa_config`` holds).

A model with missing metadata makes sherpa-onnx exit the whole process; :func:`probe` loads a
generated model in a child process first, so a generator mistake fails a test instead of
killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["PRODUCTION", "TINY", "lstm_transducer", "parameter_count", "probe", "wenet_ctc"]

OPSET = 13
IR_VERSION = 8
FEATURE_DIM = 80
SUBSAMPLING = 4

# Widths for `lstm_transducer`.
TINY: dict[str, int] = {
    "d_model": 64,
    "rnn_hidden": 64,
    "num_layers": 2,
    "joiner_dim": 64,
    "vocab_size": 100,
}
# About the size of icefall's lstm_transducer_stateless2 (~84 M parameters, sherpa-onnx's
# "lstm-en" model): ~88 M parameters, a ~350 MB fp32 encoder.
PRODUCTION: dict[str, int] = {
    "d_model": 512,
    "rnn_hidden": 1024,
    "num_layers": 12,
    "joiner_dim": 512,
    "vocab_size": 500,
}

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _pieces(count: int, rng: np.random.Generator) -> list[str]:
    """``count`` distinct BPE-like pieces; about half start a word (``▁``)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    candidates: list[str] = []
    for syllable in syllables:
        candidates += ["▁" + syllable, syllable]
    for syllable in syllables:
        for tail in _CONSONANTS:
            candidates += ["▁" + syllable + tail, syllable + tail]
    if count > len(candidates):
        raise ValueError(f"vocab_size too large: at most {len(candidates) + 3}")
    chosen = candidates[:count]
    order = rng.permutation(count)
    return [chosen[i] for i in order]


def _write_tokens(path: Path, symbols: Sequence[str]) -> None:
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")


def _init(rng: np.random.Generator, shape: Sequence[int], fan_in: int) -> np.ndarray:
    scale = 1.0 / np.sqrt(fan_in)
    return (rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(scale)).astype(
        np.float32
    )


class _Graph:
    """A small builder: initializers, nodes and fresh names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def i64(self, values: Sequence[int], hint: str = "i") -> str:
        return self.const(np.asarray(values, dtype=np.int64), hint)

    def f32(self, value: float, hint: str = "f") -> str:
        return self.const(np.asarray(value, dtype=np.float32), hint)

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> str:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else ",".join(outs)

    def ops(self, op_type: str, inputs: Sequence[str], n_out: int, **attrs: Any) -> list[str]:
        return self.op(op_type, inputs, n_out, **attrs).split(",")

    def rename(self, value: str, output: str) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [output]))

    def model(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        meta: Mapping[str, object],
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.inits)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="talkies-tests"
        )
        model.ir_version = IR_VERSION
        helper.set_model_props(model, {k: str(v) for k, v in meta.items()})
        onnx.checker.check_model(model)
        return model


def _energy_gate(g: _Graph, frames: str, out_frames_shape: str, threshold: float, k: float) -> str:
    """[N, 4*T', 80] fbank -> [N, T', 1]: ``k * (mean log-mel - threshold)``."""
    mean = g.op("ReduceMean", [frames], axes=[2], keepdims=1)  # [N, 4T', 1]
    grouped = g.op("Reshape", [mean, out_frames_shape])  # [N, T', 4]
    energy = g.op("ReduceMean", [grouped], axes=[2], keepdims=1)  # [N, T', 1]
    return g.op("Mul", [g.op("Sub", [energy, g.f32(threshold)]), g.f32(k)])


def lstm_transducer(
    directory: Path,
    *,
    d_model: int = 64,
    rnn_hidden: int = 64,
    num_layers: int = 2,
    joiner_dim: int = 64,
    vocab_size: int = 100,
    context_size: int = 2,
    decode_chunk_len: int = 32,
    seed: int = 0,
    silence_threshold: float = -10.0,
    gate_scale: float = 3.0,
) -> dict[str, str]:
    """Write ``encoder.onnx``, ``decoder.onnx``, ``joiner.onnx`` and ``tokens.txt``.

    ``silence_threshold`` is the mean log-mel energy (sherpa's fbank of samples in [-1, 1];
    digital silence is log(FLT_EPSILON) ~ -15.9) below which the joiner favours blank.
    """
    if decode_chunk_len % SUBSAMPLING:
        raise ValueError("decode_chunk_len must be a multiple of 4")
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    symbols = ["<blk>", "<sos/eos>", "<unk>", *_pieces(vocab_size - 3, rng)]
    _write_tokens(directory / "tokens.txt", symbols)
    out_frames = decode_chunk_len // SUBSAMPLING
    # icefall's LSTM export reads 2*4+1 frames of right context beyond each chunk's shift.
    chunk_frames = decode_chunk_len + 2 * SUBSAMPLING + 1
    D, H, J, V = d_model, rnn_hidden, joiner_dim, vocab_size

    # -- encoder -------------------------------------------------------------------------
    g = _Graph()
    x = g.op("Slice", ["x", g.i64([0]), g.i64([decode_chunk_len]), g.i64([1])])
    gate = _energy_gate(g, x, g.i64([0, out_frames, SUBSAMPLING]), silence_threshold, gate_scale)
    xn = g.op("Mul", [g.op("Sub", [x, g.f32(-6.0)]), g.f32(0.25)])
    stacked = g.op("Reshape", [xn, g.i64([0, out_frames, SUBSAMPLING * FEATURE_DIM])])
    w_in = g.const(_init(rng, (SUBSAMPLING * FEATURE_DIM, D), SUBSAMPLING * FEATURE_DIM))
    emb = g.op("Tanh", [g.op("MatMul", [stacked, w_in])])
    layer_in = g.op("Transpose", [emb], perm=[1, 0, 2])  # [T', N, D]
    next_h: list[str] = []
    next_c: list[str] = []
    axis0 = g.i64([0])
    for layer in range(num_layers):
        index = g.const(np.asarray(layer, dtype=np.int64), "layer")
        h0 = g.op("Gather", ["h", index], axis=0)  # [N, D]
        c0 = g.op("Gather", ["c", index], axis=0)  # [N, H]
        p_up = g.const(_init(rng, (D, H), D))
        p_down = g.const(_init(rng, (H, D), H))
        init_h = g.op("Unsqueeze", [g.op("MatMul", [h0, p_up]), axis0])
        init_c = g.op("Unsqueeze", [c0, axis0])
        w = g.const(_init(rng, (1, 4 * H, D), D))
        r = g.const(_init(rng, (1, 4 * H, H), H))
        b = g.const(np.zeros((1, 8 * H), dtype=np.float32))
        y, y_h, y_c = g.ops(
            "LSTM", [layer_in, w, r, b, "", init_h, init_c], 3, hidden_size=H, direction="forward"
        )
        y = g.op("Squeeze", [y, g.i64([1])])  # [T', N, H]
        layer_in = g.op("Add", [layer_in, g.op("MatMul", [y, p_down])])
        last_h = g.op("MatMul", [g.op("Squeeze", [y_h, axis0]), p_down])  # [N, D]
        next_h.append(g.op("Unsqueeze", [last_h, axis0]))
        next_c.append(y_c)
    enc = g.op("Transpose", [layer_in], perm=[1, 0, 2])  # [N, T', D]
    w_out = g.const(_init(rng, (D, J - 1), D))
    projected = g.op("MatMul", [enc, w_out])
    g.rename(g.op("Concat", [gate, projected], axis=2), "encoder_out")
    g.rename(g.op("Concat", next_h, axis=0), "next_h")
    g.rename(g.op("Concat", next_c, axis=0), "next_c")
    f32 = TensorProto.FLOAT
    encoder = g.model(
        "encoder",
        [
            helper.make_tensor_value_info("x", f32, ["N", "T", FEATURE_DIM]),
            helper.make_tensor_value_info("h", f32, [num_layers, "N", D]),
            helper.make_tensor_value_info("c", f32, [num_layers, "N", H]),
        ],
        [
            helper.make_tensor_value_info("encoder_out", f32, ["N", "T_out", J]),
            helper.make_tensor_value_info("next_h", f32, [num_layers, "N", D]),
            helper.make_tensor_value_info("next_c", f32, [num_layers, "N", H]),
        ],
        {
            "model_type": "lstm",
            "num_encoder_layers": num_layers,
            "T": chunk_frames,
            "decode_chunk_len": decode_chunk_len,
            "rnn_hidden_size": H,
            "d_model": D,
        },
    )
    onnx.save(encoder, directory / "encoder.onnx")

    # -- decoder -------------------------------------------------------------------------
    g = _Graph()
    table = g.const(_init(rng, (V, J), 1))
    embedded = g.op("Gather", [table, "y"], axis=0)  # [N, ctx, J]
    flat = g.op("Reshape", [embedded, g.i64([0, context_size * J])])
    w_dec = g.const(_init(rng, (context_size * J, J), context_size * J))
    g.rename(g.op("Tanh", [g.op("MatMul", [flat, w_dec])]), "decoder_out")
    decoder = g.model(
        "decoder",
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", context_size])],
        [helper.make_tensor_value_info("decoder_out", f32, ["N", J])],
        {"vocab_size": V, "context_size": context_size},
    )
    onnx.save(decoder, directory / "decoder.onnx")

    # -- joiner --------------------------------------------------------------------------
    g = _Graph()
    hidden = g.op("Tanh", [g.op("Add", ["encoder_out", "decoder_out"])])
    bias = np.zeros(V, dtype=np.float32)
    bias[1:3] = -100.0  # never <sos/eos> or <unk>
    logits = g.op("Add", [g.op("MatMul", [hidden, g.const(_init(rng, (J, V), J))]), g.const(bias)])
    gate_in = g.op("Slice", ["encoder_out", g.i64([0]), g.i64([1]), g.i64([1])])  # [N, 1]
    to_blank = np.zeros((1, V), dtype=np.float32)
    to_blank[0, 0] = -1.0  # gate < 0 (silence) raises blank; gate > 0 (speech) lowers it
    g.rename(g.op("Add", [logits, g.op("MatMul", [gate_in, g.const(to_blank)])]), "logit")
    joiner = g.model(
        "joiner",
        [
            helper.make_tensor_value_info("encoder_out", f32, ["N", J]),
            helper.make_tensor_value_info("decoder_out", f32, ["N", J]),
        ],
        [helper.make_tensor_value_info("logit", f32, ["N", V])],
        {"joiner_dim": J},
    )
    onnx.save(joiner, directory / "joiner.onnx")
    return {
        "tokens": "tokens.txt",
        "encoder": "encoder.onnx",
        "decoder": "decoder.onnx",
        "joiner": "joiner.onnx",
    }


def wenet_ctc(
    directory: Path,
    *,
    output_size: int = 64,
    head: int = 4,
    num_blocks: int = 2,
    cnn_module_kernel: int = 7,
    right_context: int = 6,
    vocab_size: int = 100,
    blank_bias: float = 1.5,
    seed: int = 0,
) -> dict[str, str]:
    """Write ``model.onnx`` and ``tokens.txt``: a chunked CTC model with attention and
    convolution caches in WeNet's export layout; its outputs depend on the caches."""
    if output_size % head:
        raise ValueError("output_size must be a multiple of head")
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    symbols = ["<blank>", "<unk>", *_pieces(vocab_size - 3, rng), "<sos/eos>"]
    _write_tokens(directory / "tokens.txt", symbols)
    W, V, dh2 = output_size, vocab_size, output_size // head * 2

    g = _Graph()
    # Chunk frames: x has (chunk-1)*4 + right_context + 1 frames; use the first chunk*4.
    length = g.op("Gather", [g.op("Shape", ["x"]), g.i64([1])])  # [1]
    chunk = g.op("Add", [g.op("Div", [g.op("Sub", [length, g.i64([right_context + 1])]),
                                      g.i64([SUBSAMPLING])]), g.i64([1])])  # fmt: skip
    end = g.op("Mul", [chunk, g.i64([SUBSAMPLING])])
    x = g.op("Slice", ["x", g.i64([0]), end, g.i64([1])])
    # WeNet features are of int16-scale samples: log-mel ~ +20 on speech, -15.9 on silence.
    xn = g.op("Mul", [g.op("Sub", [x, g.f32(8.0)]), g.f32(0.1)])
    stacked = g.op("Reshape", [xn, g.i64([0, -1, SUBSAMPLING * FEATURE_DIM])])
    w_in = g.const(_init(rng, (SUBSAMPLING * FEATURE_DIM, W), SUBSAMPLING * FEATURE_DIM))
    hidden = g.op("Tanh", [g.op("MatMul", [stacked, w_in])])  # [1, chunk, W]
    att_ctx = g.op("ReduceMean", ["att_cache"], axes=[0, 1, 2], keepdims=0)  # [dh2]
    hidden = g.op("Add", [hidden, g.op("MatMul", [att_ctx, g.const(_init(rng, (dh2, W), dh2))])])
    cnn_ctx = g.op("ReduceMean", ["cnn_cache"], axes=[0, 1, 3], keepdims=0)  # [W]
    hidden = g.op("Add", [hidden, g.op("Mul", [cnn_ctx, g.f32(0.5)])])
    # The offset, cache size and mask take part (as zeros), so the inputs stay in the graph.
    unused = [
        g.op("Cast", ["offset"], to=TensorProto.FLOAT),
        g.op("Cast", ["required_cache_size"], to=TensorProto.FLOAT),
        g.op("ReduceSum", [g.op("Cast", ["att_mask"], to=TensorProto.FLOAT)], keepdims=0),
    ]
    for value in unused:
        hidden = g.op("Add", [hidden, g.op("Mul", [value, g.f32(0.0)])])
    # Caches: the newest chunk is appended, the oldest dropped (the shape is kept).
    per_frame = g.op("MatMul", [hidden, g.const(_init(rng, (W, num_blocks * head * dh2), W))])
    per_frame = g.op("Reshape", [per_frame, g.i64([-1, num_blocks, head, dh2])])
    new_att = g.op("Tanh", [g.op("Transpose", [per_frame], perm=[1, 2, 0, 3])])
    joined = g.op("Concat", ["att_cache", new_att], axis=2)
    g.rename(g.op("Slice", [joined, chunk, g.i64([1 << 62]), g.i64([2])]), "r_att_cache")
    frame_mean = g.op("ReduceMean", [hidden], axes=[0, 1], keepdims=0)  # [W]
    frame_mean = g.op("Reshape", [frame_mean, g.i64([1, 1, W, 1])])
    decayed = g.op("Mul", ["cnn_cache", g.f32(0.9)])
    g.rename(g.op("Tanh", [g.op("Add", [decayed, frame_mean])]), "r_cnn_cache")
    bias = np.zeros(V, dtype=np.float32)
    bias[0] = blank_bias
    bias[1] = bias[V - 1] = -100.0  # never <unk> or <sos/eos>
    w_out = g.const(_init(rng, (W, V), W) * np.float32(4.0))
    logits = g.op("Add", [g.op("MatMul", [hidden, w_out]), g.const(bias)])
    g.rename(g.op("LogSoftmax", [logits], axis=-1), "log_probs")
    f32 = TensorProto.FLOAT
    model = g.model(
        "wenet_ctc",
        [
            helper.make_tensor_value_info("x", f32, [1, "L", FEATURE_DIM]),
            helper.make_tensor_value_info("offset", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("required_cache_size", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("att_cache", f32, [num_blocks, head, "R", dh2]),
            helper.make_tensor_value_info(
                "cnn_cache", f32, [num_blocks, 1, W, cnn_module_kernel - 1]
            ),
            helper.make_tensor_value_info("att_mask", TensorProto.BOOL, [1, 1, "M"]),
        ],
        [
            helper.make_tensor_value_info("log_probs", f32, [1, "C", V]),
            helper.make_tensor_value_info("r_att_cache", f32, [num_blocks, head, "R", dh2]),
            helper.make_tensor_value_info(
                "r_cnn_cache", f32, [num_blocks, 1, W, cnn_module_kernel - 1]
            ),
        ],
        {
            "head": head,
            "num_blocks": num_blocks,
            "output_size": W,
            "cnn_module_kernel": cnn_module_kernel,
            "right_context": right_context,
            "subsampling_factor": SUBSAMPLING,
            "vocab_size": V,
        },
    )
    onnx.save(model, directory / "model.onnx")
    return {"tokens": "tokens.txt", "model": "model.onnx"}


def parameter_count(directory: Path) -> int:
    """Float parameters in every ``*.onnx`` under ``directory``."""
    total = 0
    for path in sorted(directory.glob("*.onnx")):
        model = onnx.load(path)
        total += sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    return total


_PROBE = """
import json, sys
import numpy as np
import sherpa_onnx
factory, root, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kwargs = {k: (root + "/" + v if k in ("tokens", "encoder", "decoder", "joiner", "model") else v)
          for k, v in config.items()}
rec = getattr(sherpa_onnx.OnlineRecognizer, factory)(**kwargs)
s = rec.create_stream()
s.accept_waveform(16000, np.random.default_rng(0).uniform(-0.1, 0.1, 16000).astype("float32"))
s.input_finished()
while rec.is_ready(s):
    rec.decode_stream(s)
print("PROBE-OK", json.dumps(rec.get_result(s)))
"""


def probe(factory: str, directory: Path, config: Mapping[str, object], timeout: float = 60) -> str:
    """Load and run the model in a child process (sherpa-onnx exits the process on a bad
    model); returns the decoded text of one second of noise, or raises AssertionError."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, factory, str(directory), json.dumps(dict(config))],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    marker = "PROBE-OK "
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(marker)]
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"sherpa-onnx could not run the generated {factory} model in {directory}: "
            f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    text: str = json.loads(lines[-1][len(marker) :])
    return text


# The engine's default tail_padding: silence added before input_finished() so the last partial
# chunk is decoded (sherpa-onnx's own examples do the same).
TAIL_SECONDS = 0.66


def decode_directly(recognizer: Any, pcm: bytes) -> tuple[list[str], str]:
    """sherpa-onnx called directly, as the engine should behave: (non-empty endpoint texts,
    final text) for ``pcm``, checking for an endpoint after every chunk. The tests' parity
    reference and the benchmark's bare baseline."""
    stream = recognizer.create_stream()
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / np.float32(32768)
    stream.accept_waveform(16000, samples)
    endpoints: list[str] = []
    while recognizer.is_ready(stream):
        recognizer.decode_stream(stream)
        if recognizer.is_endpoint(stream):
            text = recognizer.get_result(stream)
            if text:
                endpoints.append(text)
            recognizer.reset(stream)
    stream.accept_waveform(16000, np.zeros(round(TAIL_SECONDS * 16000), dtype=np.float32))
    stream.input_finished()
    while recognizer.is_ready(stream):
        recognizer.decode_stream(stream)
    return endpoints, recognizer.get_result(stream)
