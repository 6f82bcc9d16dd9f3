"""A tiny cache-aware streaming RNN-T in parakeet.cpp's GGUF layout, with designed weights.

No model hub is reachable, so the parakeet.cpp tests run the real runtime (PyPI
``parakeet-cpp-cuda``) on a model written here with the ``gguf`` package, in the layout that
parakeet.cpp's converter (``scripts/convert_parakeet_to_gguf.py``) writes for NVIDIA's
cache-aware streaming FastConformer transducers (Nemotron streaming, the realtime EOU model):
``general.architecture = "parakeet"``, the ``parakeet.*`` keys, and NeMo's tensor names.

Random weights make a transducer babble or stay silent at random. These weights are chosen
instead, so that the runtime's output is known in advance and a test can check it exactly:
the model "hears" :data:`TONES`, five pure tones, one word per tone.

- The mel filterbank has one band per tone (two adjacent mel bins each), all other bins are
  empty, and ``log_zero_guard = 1``: silence and the convolutions' zero padding both read 0.
- The subsampling convolutions sum their 3x3 windows, so tone ``k`` lights its own columns
  of the subsampled spectrum; ``pre_encode.out`` reads each tone's columns into encoder
  dimension ``k`` and adds a constant 1 in dimension :data:`_SILENCE`.
- Every conformer branch is zero, so a layer is its final LayerNorm and the encoder output
  is the normalised ``[tone energies..., 1]``: tone ``k`` dominates while it plays, the
  constant while nothing does.
- The prediction network remembers only the last token (forget gate shut), as a one-hot of
  the tone it was plus a "text" flag.
- The joint emits tone ``k``'s word when tone ``k`` plays and the last token was not that
  word (one word per tone, however long it lasts), ``<EOU>`` on silence after a word (the
  runtime then resets the decoder to its start state, so once per pause), else blank.

With a ``prompt`` (Nemotron's language conditioning), the prompt kernel is an exact identity
on the encoder output (``relu(x) - relu(-x)``): every known language gives the same words,
and an unknown one is refused by the runtime.

Times: the encoder frame is 80 ms (hop 10 ms, subsampling 8); a chunk is two encoder frames
with one frame of right context.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

__all__ = [
    "LANGUAGES",
    "SAMPLE_RATE",
    "TONES",
    "WORDS",
    "phrase",
    "silence",
    "speech",
    "tone_transducer",
]

SAMPLE_RATE = 16000
N_FFT, WIN, HOP = 512, 400, 160
N_MELS = 128
D_MODEL, N_HEADS, FF_DIM, CONV_KERNEL, CONV_CHANNELS = 16, 2, 16, 9, 4
PRED_HIDDEN, JOINT_HIDDEN = 8, 8
# One word per tone; each piece starts a word (SentencePiece's "▁").
WORDS = ("alpha", "bravo", "charlie", "delta", "echo")
_SPECIALS = ("<unk>", "<EOU>", "<EOB>")
PIECES = (*_SPECIALS, *("\u2581" + w for w in WORDS))
_EOU = PIECES.index("<EOU>")
_FIRST_WORD = len(_SPECIALS)
# FFT bin of each tone (exact bin centres of the 512-point FFT), 1.4 kHz apart.
_TONE_BINS = tuple(20 + 45 * k for k in range(len(WORDS)))
TONES = tuple(b * SAMPLE_RATE / N_FFT for b in _TONE_BINS)  # Hz: 625.0 ... 6250.0
_TONE_MELS = tuple(24 * k + 10 for k in range(len(WORDS)))  # each tone fills two mel bins
_SILENCE = len(WORDS)  # the encoder dimension that holds the constant
_SPOKEN = len(WORDS)  # the prediction-network unit set after any word
LANGUAGES = {"en": 0, "en-US": 0, "de": 1, "auto": 3}
_NUM_PROMPTS, _PROMPT_DEFAULT = 4, "auto"


def _subsampled(n: int, *, causal: bool) -> int:
    """Length after the three stride-2, kernel-3 stages of NeMo's dw_striding: padded 2+1
    when causal, 1+1 otherwise."""
    for _ in range(3):
        n = n // 2 + 1 if causal else (n - 1) // 2 + 1
    return n


def tone_transducer(
    path: Path, *, prompt: bool = True, streaming: bool = True, name: str = "talkies-tone-rnnt"
) -> Path:
    """Write the model to ``path`` (a ``.gguf`` file, ~60 kB) and return ``path``.

    ``streaming=False`` leaves out the cache-aware streaming keys: an offline model, which
    parakeet.cpp loads but cannot stream.
    """
    D, C, P, J = D_MODEL, CONV_CHANNELS, PRED_HIDDEN, JOINT_HIDDEN
    V = len(PIECES)
    F = _subsampled(N_MELS, causal=streaming)
    writer = gguf.GGUFWriter(str(path), "parakeet")
    writer.add_string("general.name", name)
    writer.add_string("parakeet.arch", "rnnt")
    u32 = writer.add_uint32
    for key, value in {
        "encoder.feat_in": N_MELS,
        "encoder.d_model": D,
        "encoder.n_layers": 1,
        "encoder.n_heads": N_HEADS,
        "encoder.ff_dim": FF_DIM,
        "encoder.conv_kernel": CONV_KERNEL,
        "encoder.subsampling_factor": 8,
        "encoder.subsampling_conv_channels": C,
        "encoder.pos_emb_max_len": 5000,
        "preprocessor.sample_rate": SAMPLE_RATE,
        "preprocessor.n_mels": N_MELS,
        "preprocessor.n_fft": N_FFT,
        "preprocessor.win_length": WIN,
        "preprocessor.hop_length": HOP,
        "vocab_size": V,
        "blank_id": V,
        "decoder.pred_hidden": P,
        "decoder.pred_rnn_layers": 1,
        "joint.joint_hidden": J,
        "decoding.max_symbols": 10,
    }.items():
        u32(f"parakeet.{key}", value)
    writer.add_string("parakeet.encoder.conv_norm_type", "layer_norm")
    writer.add_bool("parakeet.encoder.xscaling", False)
    writer.add_bool("parakeet.encoder.use_bias", True)
    if streaming:
        # Cache-aware streaming: the realtime EOU model's schedule with a short left context.
        writer.add_int32("parakeet.encoder.att_context_left", 8)
        writer.add_int32("parakeet.encoder.att_context_right", 1)
        writer.add_string("parakeet.encoder.att_context_style", "chunked_limited")
        writer.add_bool("parakeet.encoder.causal_downsampling", True)
        writer.add_bool("parakeet.encoder.conv_causal", True)
        writer.add_array("parakeet.streaming.chunk_size", [9, 16])
        writer.add_array("parakeet.streaming.shift_size", [9, 16])
        writer.add_array("parakeet.streaming.pre_encode_cache_size", [0, 9])
        writer.add_int32("parakeet.streaming.cache_drop_size", 0)
        writer.add_int32("parakeet.streaming.last_channel_cache_size", CONV_KERNEL - 1)
        writer.add_int32("parakeet.streaming.valid_out_len", 2)
        writer.add_int32("parakeet.streaming.drop_extra_pre_encoded", 2)
    if prompt:
        writer.add_bool("parakeet.prompt.present", True)
        u32("parakeet.prompt.num_prompts", _NUM_PROMPTS)
        writer.add_array("parakeet.prompt.dictionary.keys", list(LANGUAGES))
        writer.add_array("parakeet.prompt.dictionary.values", list(LANGUAGES.values()))
        writer.add_string("parakeet.prompt.default_lang", _PROMPT_DEFAULT)
    writer.add_float32("parakeet.preprocessor.preemph", 0.97)
    writer.add_float32("parakeet.preprocessor.mag_power", 2.0)
    # Not "per_feature": a per-utterance normalisation would erase the silence/tone contrast.
    writer.add_string("parakeet.preprocessor.normalize", "NA")
    # log(power + 1): silence is exactly 0, like the convolutions' zero padding.
    writer.add_float32("parakeet.preprocessor.log_zero_guard", 1.0)
    writer.add_array("parakeet.tokenizer.pieces", list(PIECES))
    writer.add_string("parakeet.joint.activation", "relu")

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, np.float32)

    t: dict[str, np.ndarray] = {}
    fb = zeros(1, N_MELS, N_FFT // 2 + 1)
    for mel, fft_bin in zip(_TONE_MELS, _TONE_BINS, strict=True):
        fb[0, mel : mel + 2, fft_bin - 2 : fft_bin + 3] = 1.0
    t["preprocessor.featurizer.fb"] = fb
    t["preprocessor.featurizer.window"] = np.hanning(WIN).astype(np.float32)

    # Subsampling: channel 0 sums each 3x3 window at every stage; other channels stay 0.
    pre = "encoder.pre_encode."
    summing = zeros(C, 1, 3, 3)
    summing[0] = 1.0
    only_first = zeros(C, C, 1, 1)
    only_first[0, 0] = 1.0
    for conv, weight in (
        ("conv.0", summing),
        ("conv.2", summing),
        ("conv.3", only_first),
        ("conv.5", summing),
        ("conv.6", only_first),
    ):
        t[f"{pre}{conv}.weight"], t[f"{pre}{conv}.bias"] = weight, zeros(C)
    # Tone k's mel bins (24k+10, 24k+11) land in columns 3k+2..3k+3 with causal padding, or
    # 3k+1..3k+2 with symmetric padding: read all three. The scale only has to make a playing
    # tone much larger than the constant 1 (LayerNorm removes the rest).
    out = zeros(D, C * F)
    for k in range(len(WORDS)):
        out[k, 3 * k + 1 : 3 * k + 4] = 1e-2
    out_bias = zeros(D)
    out_bias[_SILENCE] = 1.0
    t[f"{pre}out.weight"], t[f"{pre}out.bias"] = out, out_bias

    # One conformer layer whose every branch is zero: x -> norm_out(x).
    layer = "encoder.layers.0."
    for norm in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2"):
        t[f"{layer}{norm}.weight"], t[f"{layer}{norm}.bias"] = ones(D), zeros(D)
    t[f"{layer}norm_out.weight"], t[f"{layer}norm_out.bias"] = ones(D), zeros(D)
    for ff in ("feed_forward1", "feed_forward2"):
        t[f"{layer}{ff}.linear1.weight"], t[f"{layer}{ff}.linear1.bias"] = (
            zeros(FF_DIM, D),
            zeros(FF_DIM),
        )
        t[f"{layer}{ff}.linear2.weight"], t[f"{layer}{ff}.linear2.bias"] = (
            zeros(D, FF_DIM),
            zeros(D),
        )
    for proj in ("linear_q", "linear_k", "linear_v", "linear_out"):
        t[f"{layer}self_attn.{proj}.weight"], t[f"{layer}self_attn.{proj}.bias"] = (
            zeros(D, D),
            zeros(D),
        )
    t[f"{layer}self_attn.linear_pos.weight"] = zeros(D, D)
    t[f"{layer}self_attn.pos_bias_u"] = zeros(N_HEADS, D // N_HEADS)
    t[f"{layer}self_attn.pos_bias_v"] = zeros(N_HEADS, D // N_HEADS)
    conv = f"{layer}conv."
    t[f"{conv}pointwise_conv1.weight"], t[f"{conv}pointwise_conv1.bias"] = (
        zeros(2 * D, D, 1),
        zeros(2 * D),
    )
    t[f"{conv}depthwise_conv.weight"] = zeros(D, 1, CONV_KERNEL)
    t[f"{conv}depthwise_conv.bias"] = zeros(D)
    # The converter keeps NeMo's name "batch_norm" for the conv module's norm even when it is
    # a LayerNorm (conv_norm_type = layer_norm).
    t[f"{conv}batch_norm.weight"], t[f"{conv}batch_norm.bias"] = ones(D), zeros(D)
    t[f"{conv}pointwise_conv2.weight"], t[f"{conv}pointwise_conv2.bias"] = zeros(D, D, 1), zeros(D)

    # Prediction network: an LSTM with the forget gate shut and input/output gates open, so
    # its output is tanh(tanh(embedding of the last token)) ~ 0.76 on the embedded units.
    # Units 0-4: "the last token was word k"; unit 5: "the last token was a word".
    embed = zeros(V + 1, P)  # row V (blank) is the start state: all zero
    for k in range(len(WORDS)):
        embed[_FIRST_WORD + k, k] = 3.0
        embed[_FIRST_WORD + k, _SPOKEN] = 3.0
    t["decoder.prediction.embed.weight"] = embed
    w_ih = zeros(4 * P, P)  # PyTorch gate order: input, forget, cell, output
    w_ih[2 * P : 3 * P] = np.eye(P, dtype=np.float32)
    b_ih = zeros(4 * P)
    b_ih[0:P], b_ih[P : 2 * P], b_ih[3 * P : 4 * P] = 10.0, -10.0, 10.0
    lstm = "decoder.prediction.dec_rnn.lstm."
    t[f"{lstm}weight_ih_l0"], t[f"{lstm}weight_hh_l0"] = w_ih, zeros(4 * P, P)
    t[f"{lstm}bias_ih_l0"], t[f"{lstm}bias_hh_l0"] = b_ih, zeros(4 * P)

    # Joint: hidden unit k (tone k plays and the last word was not k) emits word k; unit 5
    # (silence after a word) emits <EOU>; blank wins otherwise.
    enc = zeros(J, D)
    enc_bias = zeros(J)
    pred = zeros(J, P)
    for k in range(len(WORDS)):
        # Tone k must dominate: where two tones meet, neither fires (one word per tone).
        enc[k, : len(WORDS)] = -1.0
        enc[k, k], enc[k, _SILENCE] = 1.0, -1.0
        pred[k, k] = -20.0
    enc[_SILENCE, _SILENCE] = 1.0
    enc[_SILENCE, : len(WORDS)] = -1.0
    enc_bias[_SILENCE] = -10.0
    pred[_SILENCE, _SPOKEN] = 10.0
    t["joint.enc.weight"], t["joint.enc.bias"] = enc, enc_bias
    t["joint.pred.weight"], t["joint.pred.bias"] = pred, zeros(J)
    head = zeros(V + 1, J)
    head_bias = np.full(V + 1, -10.0, np.float32)
    for k in range(len(WORDS)):
        head[_FIRST_WORD + k, k] = 2.0
        head_bias[_FIRST_WORD + k] = 0.0
    head[_EOU, _SILENCE] = 2.0
    head_bias[_EOU] = 0.0
    head_bias[V] = 1.0  # blank
    t["joint.joint_net.2.weight"], t["joint.joint_net.2.bias"] = head, head_bias

    if prompt:
        # relu(x) - relu(-x) = x: the language one-hot (the last columns) is ignored.
        eye = np.eye(D, dtype=np.float32)
        first = zeros(2 * D, D + _NUM_PROMPTS)
        first[:D, :D], first[D:, :D] = eye, -eye
        t["prompt_kernel.0.weight"], t["prompt_kernel.0.bias"] = first, zeros(2 * D)
        t["prompt_kernel.2.weight"] = np.concatenate([eye, -eye], axis=1)
        t["prompt_kernel.2.bias"] = zeros(D)

    for tensor_name, tensor in t.items():
        writer.add_tensor(tensor_name, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- audio -----------------------------------------------------------------------------------


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def phrase(words: Sequence[str], *, seconds: float = 0.32, amplitude: float = 0.3) -> np.ndarray:
    """The tones of ``words`` back to back, each ``seconds`` long, phase-continuous, with
    10 ms raised-cosine ramps at the ends (a click would light every band at once)."""
    n = round(seconds * SAMPLE_RATE)
    freqs = np.repeat([TONES[WORDS.index(w)] for w in words], n)
    phase = 2 * np.pi * np.cumsum(freqs) / SAMPLE_RATE
    wave = amplitude * np.sin(phase)
    ramp = round(0.01 * SAMPLE_RATE)
    envelope = np.ones(len(wave))
    envelope[:ramp] = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
    envelope[-ramp:] = envelope[:ramp][::-1]
    return (wave * envelope).astype(np.float32)


def speech(*utterances: Sequence[str], gap: float = 0.8, lead: float = 0.3) -> bytes:
    """PCM16LE: ``lead`` s of silence, then each utterance followed by ``gap`` s of silence."""
    parts = [silence(lead)]
    for words in utterances:
        parts += [phrase(words), silence(gap)]
    samples = np.concatenate(parts)
    pcm: bytes = np.round(np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    return pcm
