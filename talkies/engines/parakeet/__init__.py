"""``parakeet_cpp``: NVIDIA's cache-aware streaming transducers (Nemotron streaming ASR, the
realtime EOU model) through the parakeet.cpp runtime of the PyPI package ``parakeet-cpp-cuda``.

**The runtime.** The package's Python module ``parakeet`` loads its bundled
``libparakeet.so`` when it is imported. That library links ggml's CUDA backend, which needs
the CUDA 12 runtime (``libcudart.so.12``), cuBLAS (``libcublas.so.12``, ``libcublasLt.so.12``)
and NCCL (``libnccl.so.2``), shipped by NVIDIA's ``nvidia-*-cu12`` wheels, and the NVIDIA
driver's ``libcuda.so.1``, which no wheel ships. Nothing puts the wheels' folders on the
loader's path, so :func:`runtime` loads those libraries from the installed wheels first (the
system's copies otherwise), then the driver, then imports ``parakeet``; the first one missing
becomes the 4500 detail (:func:`require_runtime`). Where the driver finds no GPU, ggml falls
back to its CPU backend; the device is parakeet.cpp's choice, not ``TALKIES_DEVICE``'s.

**The API used.** ``parakeet.Model`` loads the GGUF. Streams go through the library's flat C
API (``parakeet_capi.h``): ``stream_begin_lang``, ``stream_feed_json``,
``stream_finalize_json``, ``stream_free``. The Python ``parakeet.Stream`` offers no word
times; the JSON entry points (ABI 5 and later) return, per call, the newly finalised text, the
end-of-utterance events with their times, and the words finalised with their times. They are
bound with ctypes on the library handle the ``parakeet`` module loaded (``parakeet._ffi.lib``,
the package's one private name used here: the functions themselves are public C API).

parakeet.cpp computes every graph on one process-global ggml backend; its C API does not say
that two threads may use it at once, so all native calls take :data:`NATIVE_LOCK`: streams of
one server decode one call at a time.

**A stream.** Audio reaches the runtime in blocks of :data:`FEED_SAMPLES` (80 ms, one encoder
frame) whatever the client's framing, so endpoints and finals do not depend on it. After each
``accept`` the stream reports the text of the current utterance (a partial) when it changed:
the runtime has no revisable hypothesis, only text it finalised, so partials grow. An
``<EOU>`` (end of utterance) or ``<EOB>`` (end of a backchannel such as "uh-huh"; the
decoder restarts at both) ends the utterance: an endpoint with its text. Text finalised in the
same 80 ms block as the event but after it is counted before it (the runtime reports a
block's text as one string). ``finish`` flushes the runtime and returns the text after the
last endpoint.

**Word times** count from the stream's first sample. The runtime times a word only once the
next word starts (or at the end of the stream), so at an endpoint the utterance's last word
has no times yet: the endpoint's ``words`` are the words already timed, and the late word is
not reported. The final's words are complete. Language tags such as ``<en-us>``, which
Nemotron is reported to append to its transcripts, are removed from text and words.

**Languages.** A model with language prompts (Nemotron) accepts the tags in its GGUF prompt
dictionary (read from the file header by :mod:`.gguf_meta`), or their primary language
(``en-GB`` -> ``en``); no language is the model's default, ``auto`` is passed on where the
dictionary has it. Others are refused with ``invalid_language``. A model without prompts
decodes its one language whatever is asked.
"""

from ..catalogue import Executor
from .model import (
    ModelHeader,
    ParakeetModel,
    ParakeetOptions,
    ParakeetRecognition,
    choose_language,
    clean_text,
    load,
    model_file,
    parse_words,
    read_header,
)
from .native import (
    FEED_BYTES,
    FEED_SAMPLES,
    PACKAGE,
    RuntimeMissing,
    machine_problem,
    require_runtime,
    runtime,
)

__all__ = [
    "EXECUTORS",
    "FEED_BYTES",
    "FEED_SAMPLES",
    "PACKAGE",
    "ModelHeader",
    "ParakeetModel",
    "ParakeetOptions",
    "ParakeetRecognition",
    "RuntimeMissing",
    "choose_language",
    "clean_text",
    "load",
    "machine_problem",
    "model_file",
    "parse_words",
    "read_header",
    "require_runtime",
    "runtime",
]

EXECUTORS = (
    Executor(
        name="parakeet_cpp",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load,
        preflight=require_runtime,  # before fetching weights it could not run
        requires=(PACKAGE,),
        machine_problem=machine_problem,
    ),
)
