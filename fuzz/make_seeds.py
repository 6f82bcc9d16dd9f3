"""Write the seed corpora ``fuzz/corpus/{control,session,wire,http}/``.

    PYTHONPATH=. .venv/bin/python fuzz/make_seeds.py          # (re)write the seeds
    PYTHONPATH=. .venv/bin/python fuzz/make_seeds.py --check  # exit 1 if the files differ

Control seeds are literal messages. Session seeds are readable programs written with
``ProgramWriter`` (the byte format of ``fuzz._oracle.decode_program``); each names the outcome
it must reach, and every seed is run through its harness's oracle before it is written. Add a
seed by adding an entry below and rerunning; commit the output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz._http import TOKEN as HTTP_TOKEN
from fuzz._http import check_http_input, encode_http_input, wav
from fuzz._oracle import (
    BAD_VALUES,
    FUZZ_LIMITS,
    ProgramWriter,
    check_control_message,
    check_session_program,
)
from fuzz._wire import FRAMES, check_wire_input, encode_wire_input
from fuzz._wire import client_frame as frame
from talkies.protocol import ErrorCode

CORPUS = Path(__file__).resolve().parent / "corpus"

_START = {
    "type": "start",
    "model": "nemotron-3.5-asr-0.6b",
    "encoding": "pcm_s16le",
    "sample_rate": 16000,
    "channels": 1,
}


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode("utf-8")


def _padded(obj: object, size: int) -> bytes:
    """``obj`` as JSON followed by spaces up to exactly ``size`` bytes."""
    text = _json(obj)
    return text + b" " * (size - len(text))


CONTROL_SEEDS: dict[str, bytes] = {
    "start_minimal.json": _json(_START),
    "start_all_fields.json": _json(
        {**_START, "language": "pt_br", "interim_results": False, "word_timestamps": True}
    ),
    "start_language_auto.json": _json({**_START, "language": "auto"}),
    "start_language_invalid.json": _json({**_START, "language": "en--US"}),
    "start_exactly_4096_bytes.json": _padded(_START, 4096),
    "end.json": b'{"type":"end"}',
    "cancel.json": b'{"type": "cancel"}',
    "end_extra_field.json": b'{"type":"end","flush":true}',
    "other_type.json": b'{"type":"pause"}',
    "missing_type.json": b'{"model":"m"}',
    "type_not_string.json": b'{"type":1}',
    "duplicate_keys.json": (
        b'{"type":"start","model":"a","model":"b","encoding":"pcm_s16le",'
        b'"sample_rate":16000,"channels":1}'
    ),
    "unknown_field.json": _json({**_START, "vad": True}),
    "missing_field.json": b'{"type":"start","model":"m","encoding":"pcm_s16le","channels":1}',
    "deep_nesting.json": b'{"type":"start","model":' + b"[" * 2000 + b"]" * 2000 + b"}",
    "nan.json": _json(_START).replace(b"16000", b"NaN"),
    "infinity_exponent.json": _json(_START).replace(b"16000", b"1e999"),
    "float_sample_rate.json": _json(_START).replace(b"16000", b"16000.0"),
    "huge_int.json": _json(_START).replace(b"16000", b"9" * 3000),
    "invalid_utf8.json": b'{"type":"start","model":"\xff\xfe"}',
    "lone_surrogate_escape.json": _json(_START).replace(b"nemotron", b"\\ud800"),
    "utf8_bom.json": b"\xef\xbb\xbf" + _json(_START),
    "too_large_4097_bytes.json": _padded(_START, 4097),
    "non_object_array.json": b'[{"type":"start"}]',
    "non_object_string.json": b'"start"',
    "empty.json": b"",
    "wrong_types.json": _json(
        {**_START, "sample_rate": "16000", "channels": True, "interim_results": 1}
    ),
    "bool_channels.json": _json({**_START, "channels": True}),
    "unsupported_values.json": _json({**_START, "encoding": "opus", "sample_rate": 8000}),
    "invalid_model.json": _json({**_START, "model": "../etc/passwd"}),
    "trailing_garbage.json": _json(_START) + b"}",
}


def _happy_path() -> ProgramWriter:
    w = ProgramWriter().start(language=2, interim_results=True, word_timestamps=True)
    w.opened().binary(640).binary(640, pattern=7, splits=(100, 101, 500))
    w.partial("hello", [("hello", 0.0, 0.4)]).partial("hello wor", [("hello", 0.0, 0.4)])
    w.endpoint("hello world", [("hello", 0.0, 0.4), ("world", 0.5, 0.9)])
    w.audio_part(320).binary(320).tick(1.0).binary(2)
    w.control("end", splits=(3, 9))
    w.partial("again").final("again", [("again", 1.0, 1.3)])
    return w


def _duration_limit() -> ProgramWriter:
    w = ProgramWriter().start().opened()
    for _ in range(FUZZ_LIMITS.max_samples * 2 // FUZZ_LIMITS.max_frame_bytes + 1):
        w.binary(FUZZ_LIMITS.max_frame_bytes)
    return w


_BAD_RATE = BAD_VALUES.index(8000)
_NO_MODEL = 0  # BAD_VALUES[0] deletes the field

# name -> (program, the outcome the session must reach)
SESSION_SEEDS: dict[str, tuple[Callable[[], ProgramWriter], str]] = {
    "happy_path": (_happy_path, "end"),
    "happy_path_no_interim": (
        lambda: (
            ProgramWriter()
            .start(interim_results=False, as_bytes=True, splits=(1, 40, 41), split_bytes=True)
            .opened()
            .binary(4096)
            .partial("ignored")
            .endpoint("utterance")
            .control("end", as_bytes=True)
            .final("done")
        ),
        "end",
    ),
    "cancel_streaming": (
        lambda: ProgramWriter().start().opened().binary(640).control("cancel"),
        "cancel",
    ),
    "cancel_while_opening": (lambda: ProgramWriter().start().control("cancel"), "cancel"),
    "cancel_while_flushing_then_late_inputs": (
        lambda: (
            ProgramWriter()
            .start()
            .opened()
            .binary(64)
            .control("end")
            .control("cancel")
            .final("late")
            .binary(64)
            .tick(20)
            .peer_gone()
        ),
        "cancel",
    ),
    "start_unsupported_sample_rate": (
        lambda: ProgramWriter().start(corrupt=("sample_rate", _BAD_RATE)),
        ErrorCode.UNSUPPORTED_SAMPLE_RATE.value,
    ),
    "start_missing_model": (
        lambda: ProgramWriter().start(corrupt=("model", _NO_MODEL)),
        ErrorCode.MISSING_FIELD.value,
    ),
    "start_twice": (
        lambda: ProgramWriter().start().opened().start(),
        ErrorCode.INVALID_EVENT.value,
    ),
    "end_extra_field": (
        lambda: ProgramWriter().start().opened().control("end", extra_field=True),
        ErrorCode.UNKNOWN_FIELD.value,
    ),
    "frame_too_large_fragmented": (
        lambda: ProgramWriter().start().opened().binary(4098, splits=(2048,)),
        ErrorCode.FRAME_TOO_LARGE.value,
    ),
    "unaligned_frame": (
        lambda: ProgramWriter().start().opened().binary(641),
        ErrorCode.UNALIGNED_AUDIO.value,
    ),
    "empty_frame": (
        lambda: ProgramWriter().start().opened().binary(0),
        ErrorCode.EMPTY_AUDIO.value,
    ),
    "duration_limit": (_duration_limit, ErrorCode.DURATION_LIMIT.value),
    "audio_before_ready": (
        lambda: ProgramWriter().start().binary(640),
        ErrorCode.INVALID_AUDIO.value,
    ),
    "binary_inside_text_message": (
        lambda: ProgramWriter().start().opened().text_part(b'{"type":').binary(2),
        ErrorCode.INVALID_MESSAGE.value,
    ),
    "text_too_large": (
        lambda: ProgramWriter().repeated_text(ord(" "), 4097, splits=(4000,)),
        ErrorCode.MESSAGE_TOO_LARGE.value,
    ),
    "text_invalid_utf8": (
        lambda: ProgramWriter().text(b'{"type":"start","model":"\xff"}', splits=(5,)),
        ErrorCode.INVALID_JSON.value,
    ),
    "idle_before_start": (lambda: ProgramWriter().tick(4.9).tick(0.2), "idle_timeout"),
    # A start trickled in fragments never ends: the start timeout (3 s) closes it although
    # the last fragment came a second ago (issue 21, point 2).
    "start_trickled_never_finished": (
        lambda: (
            ProgramWriter()
            .text_part(b'{"type":')
            .tick(1.0)
            .text_part(b" ")
            .tick(1.0)
            .text_part(b" ")
            .tick(0.9)
            .tick(0.1)
        ),
        ErrorCode.IDLE_TIMEOUT.value,
    ),
    "idle_while_streaming": (
        lambda: ProgramWriter().start().tick(10).opened().binary(2).tick(4.0).tick(1.0),
        ErrorCode.IDLE_TIMEOUT.value,
    ),
    "refused_unknown_model": (
        lambda: ProgramWriter().start().refused(ErrorCode.UNKNOWN_MODEL, "no such model"),
        ErrorCode.UNKNOWN_MODEL.value,
    ),
    "engine_failed_streaming": (
        lambda: ProgramWriter().start().opened().binary(640).failed("decoder crashed"),
        ErrorCode.SERVER_ERROR.value,
    ),
    "engine_final_before_end": (
        lambda: ProgramWriter().start().opened().final("too early"),
        ErrorCode.SERVER_ERROR.value,
    ),
    "auth_rejected": (lambda: ProgramWriter().auth_rejected(), "unauthorized"),
    "shutting_down": (
        lambda: ProgramWriter().start().opened().binary(2).shutting_down(),
        "shutdown",
    ),
    "peer_gone_streaming": (
        lambda: ProgramWriter().start().opened().binary(2).peer_gone(),
        "peer_gone",
    ),
}


# -- wire seeds: raw client bytes after the upgrade (fuzz/_wire.py) ----------------------------


def _start(model: str = "tiny-test") -> bytes:
    return json.dumps({**_START, "model": model}).encode()


_END = b'{"type":"end"}'
_SPEECH = (b"\xb8\x0b" * 20 + b"\x48\xf4" * 20) * 8  # 20 ms of a loud square wave
_CLOSE = (1000).to_bytes(2, "big")
# A client that writes frame by frame and waits for the server between writes.
_STEPWISE = {"chunk_size": FRAMES, "patient": True}

# name -> (client bytes, how they are sent, the session's outcome, the close code on the wire)
WIRE_SEEDS: dict[str, tuple[bytes, dict[str, Any], str, int | None]] = {
    "happy_path": (
        frame(1, _start()) + frame(2, _SPEECH) * 12 + frame(1, _END),
        _STEPWISE,
        "end",
        1000,
    ),
    "happy_path_fragmented_with_ping": (
        frame(1, _start()[:20], fin=False)
        + frame(0, _start()[20:])
        + frame(2, _SPEECH[:100], fin=False)
        + frame(9, b"mid")
        + frame(0, _SPEECH[100:])
        + frame(2, _SPEECH) * 11
        + frame(1, _END),
        _STEPWISE,
        "end",
        1000,
    ),
    "happy_path_byte_by_byte": (
        frame(1, _start()) + frame(2, _SPEECH) + frame(1, _END),
        {"chunk_size": 1, "patient": True},
        "invalid_audio",  # after 64 reads the rest comes at once: audio with the start's end
        4400,
    ),
    "cancel": (
        frame(1, _start()) + frame(2, _SPEECH) + frame(1, b'{"type":"cancel"}'),
        _STEPWISE,
        "cancel",
        1000,
    ),
    "pings_and_unsolicited_pong": (
        frame(9, b"a") + frame(1, _start()) + frame(9, b"b") + frame(10, b"pong") + frame(9, b""),
        _STEPWISE,
        "peer_gone",
        None,
    ),
    "client_close": (frame(1, _start()) + frame(8, _CLOSE + b"bye"), _STEPWISE, "peer_gone", 1000),
    "client_close_without_code": (frame(8), {}, "peer_gone", 1005),
    "client_close_4000": (frame(8, (4000).to_bytes(2, "big")), {}, "peer_gone", 4000),
    # Found by the fuzzer: a client's 1007 is echoed like any close code (the oracle's rule
    # "1007 never" is about the server's own closes).
    "client_close_1007": (frame(8, (1007).to_bytes(2, "big")), {}, "peer_gone", 1007),
    "close_invalid_code": (frame(8, (999).to_bytes(2, "big")), {}, "peer_gone", 1002),
    "close_one_byte": (frame(8, b"\x03"), {}, "peer_gone", 1002),
    "close_reason_invalid_utf8": (frame(8, _CLOSE + b"\xff"), {}, "invalid_json", 4400),
    "invalid_utf8": (frame(1, b"\xff\xfe{}"), {}, "invalid_json", 4400),
    "invalid_utf8_in_fragment": (
        frame(1, b'{"type":', fin=False) + frame(0, b'"\xc3\x28"}'),
        {"chunk_size": 2},
        "invalid_json",
        4400,
    ),
    "utf8_split_between_fragments": (
        frame(1, b'{"\xc3', fin=False) + frame(0, b'\xa9":1,' + _start()[1:]),
        {"chunk_size": 1},
        "unknown_field",
        4400,
    ),
    "unmasked": (frame(1, _start(), mask=None), {}, "peer_gone", 1002),
    "continuation_first": (frame(0, b"{}"), {}, "peer_gone", 1002),
    "text_inside_text": (frame(1, b"{", fin=False) + frame(1, b"}"), {}, "peer_gone", 1002),
    "binary_inside_text": (frame(1, b"{", fin=False) + frame(2, b"\0\0"), {}, "peer_gone", 1002),
    "fragmented_ping": (
        frame(1, _start()) + frame(9, b"x", fin=False),
        _STEPWISE,
        "peer_gone",
        1002,
    ),
    "oversized_ping": (frame(9, b"x" * 126), {}, "peer_gone", 1002),
    "reserved_opcode": (frame(3), {}, "peer_gone", 1002),
    "reserved_bit": (frame(1, _start(), rsv=4), {}, "peer_gone", 1002),
    "length_top_bit": (frame(2, length=1 << 63), {}, "peer_gone", 1002),
    "length_not_minimal": (b"\x82\xfe\x00\x04" + b"\0" * 8, {}, "peer_gone", 1002),
    "control_over_4096": (
        frame(1, b'{"type":', fin=False) + frame(0, b" " * 1000, fin=False) * 5,
        {"chunk_size": 509},
        "message_too_large",
        4400,
    ),
    "terabyte_frame": (
        frame(1, _start()) + frame(2, b"\0" * 8192, length=1 << 40)[: 14 + 8192],
        _STEPWISE,
        "frame_too_large",
        4400,
    ),
    "terabyte_text": (
        frame(1, b" " * 8192, length=1 << 40)[: 14 + 8192],
        {},
        "message_too_large",
        4400,
    ),
    "frames_with_the_upgrade_head": (
        frame(9, b"early") + frame(1, _start()),
        {"trailing": True, "patient": True},
        "peer_gone",
        None,
    ),
    "audio_before_ready": (frame(1, _start()) + frame(2, _SPEECH), {}, "invalid_audio", 4400),
    "unaligned_audio": (
        frame(1, _start()) + frame(2, b"\0" * 641),
        _STEPWISE,
        "unaligned_audio",
        4400,
    ),
    "empty_audio": (frame(1, _start()) + frame(2), _STEPWISE, "empty_audio", 4400),
    "frame_too_large_fragmented": (
        frame(1, _start()) + frame(2, b"\0" * 2048, fin=False) + frame(0, b"\0" * 2050),
        _STEPWISE,
        "frame_too_large",
        4400,
    ),
    "duration_limit": (
        frame(1, _start()) + frame(2, b"\0" * 4096) * 9,
        {**_STEPWISE, "read_size": 4096},
        "duration_limit",
        4400,
    ),
    "model_offline": (frame(1, _start("offline-test")), _STEPWISE, "streaming_not_supported", 4409),
    "model_busy": (frame(1, _start("busy-test")), _STEPWISE, "model_busy", 4409),
    "model_full": (frame(1, _start("full-test")), _STEPWISE, "connection_limit", 4429),
    "model_unknown": (frame(1, _start("whisper-xl")), _STEPWISE, "unknown_model", 4404),
    "model_unopenable": (frame(1, _start("unopenable-test")), _STEPWISE, "server_error", 4500),
    "engine_broken": (
        frame(1, _start("broken-test")) + frame(2, _SPEECH),
        _STEPWISE,
        "server_error",
        4500,
    ),
    "second_start": (frame(1, _start()) + frame(1, _start()), _STEPWISE, "invalid_event", 4400),
    "end_before_ready": (frame(1, _start()) + frame(1, _END), {}, "invalid_event", 4400),
    "small_reads": (
        frame(1, _start()) + frame(2, _SPEECH) * 4 + frame(1, _END),
        {**_STEPWISE, "read_size": 509},
        "end",
        1000,
    ),
    "empty": (b"", {}, "peer_gone", None),
}


# -- HTTP: what a client sends on one connection, and the statuses it must get ---------------


def _request(
    method: str, target: str, body: bytes = b"", *headers: str, auth: bool = True
) -> bytes:
    """One HTTP/1.1 request; a Content-Length for a body (or a POST or PUT), unless a header
    already frames it."""
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\n"
    if auth:
        head += f"Authorization: Bearer {HTTP_TOKEN}\r\n"
    head += "".join(f"{h}\r\n" for h in headers)
    framed = any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers)
    if not framed and (body or method in ("POST", "PUT")):
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


def _speech(fields: dict[str, Any] | None = None, **extra: Any) -> bytes:
    doc = {"model": "speech-fuzz", "input": "hello", "voice": "alloy", "response_format": "pcm"}
    doc = {**doc, **(fields or {}), **extra}
    body = json.dumps({k: v for k, v in doc.items() if v is not None}).encode()
    return _request("POST", "/v1/audio/speech", body, "Content-Type: application/json")


def _form(*parts: tuple[str, bytes, str], boundary: str = "B") -> bytes:
    """A multipart/form-data transcription request: (name, value, file name or "")."""
    body = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        body += value + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    content_type = f"Content-Type: multipart/form-data; boundary={boundary}"
    return _request("POST", "/v1/audio/transcriptions", body, content_type)


def _chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


_WAV = wav(b"\x10\x00" * 800)
_UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
)
_MCP = ("Content-Type: application/json", "Accept: application/json, text/event-stream")
_JSON = "Content-Type: application/json"

# name: (client bytes, reads of this size (0: at once), the statuses of its responses)
HTTP_SEEDS: dict[str, tuple[bytes, int, list[int]]] = {
    "healthz": (_request("GET", "/healthz", auth=False), 0, [200]),
    "readyz_and_page": (_request("GET", "/readyz") + _request("HEAD", "/"), 0, [503, 200]),
    "stream_unknown_model": (
        _request("GET", "/v1/audio/transcriptions/stream", b"", *_UPGRADE)
        + b"\x81\x8c\0\0\0\0"
        + b'{"type":"x"}',
        0,
        [101],
    ),
    "head_unknown": (_request("HEAD", "/nope"), 0, [404]),
    "no_token": (_request("GET", "/v1/models", auth=False), 0, [401]),
    "wrong_token": (
        _request("GET", "/v1/models", b"", "Authorization: Bearer no", auth=False),
        0,
        [401],
    ),
    "token_in_query": (_request("GET", f"/v1/models?token={HTTP_TOKEN}", auth=False), 0, [401]),
    "models": (_request("GET", "/v1/models"), 0, [200]),
    "unload": (
        _request("DELETE", "/v1/models/speech-fuzz") + _request("DELETE", "/v1/models/x"),
        0,
        [200, 404],
    ),
    "method_not_allowed": (_request("PUT", "/v1/models"), 0, [405]),
    "stream_upgrade_refused_then_next": (
        _request(
            "GET",
            "/v1/audio/transcriptions/stream",
            b"",
            *_UPGRADE[:2],
            "Sec-WebSocket-Version: 8",
            _UPGRADE[3],
        )
        + _request("GET", "/healthz"),
        0,
        [426, 200],
    ),
    "stream_route_plain": (_request("GET", "/v1/audio/transcriptions/stream"), 0, [426]),
    "stream_upgrade": (
        _request("GET", "/v1/audio/transcriptions/stream", b"", *_UPGRADE),
        0,
        [101],
    ),
    "stream_upgrade_bad_key": (
        _request(
            "GET", "/v1/audio/transcriptions/stream", b"", *_UPGRADE[:3], "Sec-WebSocket-Key: x"
        ),
        0,
        [400],
    ),
    "speech_pcm": (_speech(), 0, [200]),
    "speech_wav_byte_by_byte": (_speech(response_format="wav"), 1, [200]),
    "speech_mp3_default": (_speech(response_format=None), 7, [200]),
    "speech_chunked": (
        _request("POST", "/v1/audio/speech", b"", _JSON, "Transfer-Encoding: chunked")
        + _chunked(b'{"model":"speech-fuzz",', b'"input":"hi","voice":"nova"}'),
        64,
        [200],
    ),
    "speech_unknown_field": (_speech(loud=True), 0, [400]),
    "speech_empty_input": (_speech(input=""), 0, [400]),
    "speech_no_voice": (_speech(voice=None), 0, [400]),
    "speech_unknown_voice": (_speech(voice="bob"), 0, [400]),
    "speech_speed_out_of_range": (_speech(speed=3.5), 0, [400]),
    "speech_speed_3500_digits": (_speech(speed=int("9" * 3500)), 509, [400]),
    "speech_nested_3000": (_request("POST", "/v1/audio/speech", b"[" * 3000, _JSON), 0, [400]),
    "speech_not_json": (_request("POST", "/v1/audio/speech", b"\xff{", _JSON), 0, [400]),
    "speech_unknown_model": (_speech(model="tts-1"), 0, [404]),
    "speech_asr_model": (_speech(model="asr-fuzz"), 0, [400]),
    "speech_bad_format": (_speech(response_format="ogg"), 0, [400]),
    "voices": (
        _request("GET", "/v1/audio/voices?model=speech-fuzz")
        + _request("GET", "/v1/audio/voices")
        + _request("GET", "/v1/audio/voices?model=nope"),
        0,
        [200, 400, 404],
    ),
    "transcribe_asr_model": (_form(("model", b"asr-fuzz", ""), ("file", _WAV, "a.wav")), 0, [400]),
    "transcribe_options": (
        _form(
            ("model", b"asr-fuzz", ""),
            ("language", b"en", ""),
            ("temperature", b"0.5", ""),
            ("response_format", b"srt", ""),
            ("file_path", b"a.wav", ""),
        ),
        2,
        [400],
    ),
    "transcribe_unknown_model": (
        _form(("model", b"whisper-1", ""), ("file", _WAV, "a.wav")),
        0,
        [404],
    ),
    "transcribe_no_boundary": (
        _request("POST", "/v1/audio/transcriptions", b"x", "Content-Type: multipart/form-data"),
        0,
        [400],
    ),
    "transcribe_urlencoded": (
        _request(
            "POST",
            "/v1/audio/transcriptions",
            b"model=asr-fuzz&file_path=a.wav",
            "Content-Type: application/x-www-form-urlencoded",
        ),
        0,
        [400],
    ),
    "transcribe_over_cap": (
        _form(("model", b"asr-fuzz", ""), ("file", b"\0" * 5000, "a.wav")),
        4096,
        [413],
    ),
    "files_put_get_list_delete": (
        _request("PUT", "/v1/files/a/b.wav", _WAV)
        + _request("GET", "/v1/files/a/b.wav")
        + _request("HEAD", "/v1/files/a/b.wav")
        + _request("GET", "/v1/files")
        + _request("DELETE", "/v1/files/a/b.wav"),
        0,
        [201, 200, 200, 200, 200],
    ),
    "files_dotdot": (
        _request("GET", "/v1/files/../x.wav") + _request("PUT", "/v1/files/%2e%2e/x"),
        0,
        [400, 400],
    ),
    "files_missing": (_request("GET", "/v1/files/nope.wav"), 0, [404]),
    "files_expect_continue": (
        _request("PUT", "/v1/files/c.wav", b"RIFF", "Expect: 100-continue"),
        0,
        [201],
    ),
    "mcp_tools_list": (
        _request("POST", "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', *_MCP),
        0,
        [200],
    ),
    "mcp_parse_error": (_request("POST", "/mcp", b'{"jsonrpc":', *_MCP), 0, [400]),
    "content_length_and_chunked": (
        _request(
            "POST",
            "/v1/audio/speech",
            b"",
            _JSON,
            "Content-Length: 4",
            "Transfer-Encoding: chunked",
        )
        + _chunked(b"{}")
        + _request("GET", "/healthz"),
        0,
        [400],
    ),
    # Found by fuzz_http.py: framed twice and over the head limit (2,048 bytes here) in one
    # read (4,096 bytes here) was answered 431; framing is asked first now.
    "framed_twice_head_too_large": (
        _request(
            "GET",
            "/healthz",
            b"",
            "Content-Length: 0",
            "Transfer-Encoding: chunked",
            "X-Pad: " + "a" * 3000,
        )
        + _chunked(b""),
        0,
        [400],
    ),
    "chunk_size_zz": (
        _request("POST", "/v1/audio/speech", b"", _JSON, "Transfer-Encoding: chunked")
        + b"zz\r\n{}\r\n0\r\n\r\n",
        0,
        [400],
    ),
    "chunk_shorter_than_declared": (
        _request("POST", "/v1/audio/speech", b"", _JSON, "Transfer-Encoding: chunked")
        + b"5\r\n{}\r\n0\r\n\r\n",
        3,
        [400],
    ),
    "transfer_coding_gzip": (
        _request("POST", "/v1/audio/speech", b"{}", _JSON, "Transfer-Encoding: gzip"),
        0,
        [400],
    ),
    "two_content_lengths": (
        _request("POST", "/v1/audio/speech", b"{}", "Content-Length: 2", "Content-Length: 3"),
        0,
        [400],
    ),
    "pipelined_keep_alive": (
        _request("GET", "/healthz") + _speech(input="") + _request("GET", "/v1/models", auth=False),
        0,
        [200, 400, 401],
    ),
    "http_1_0": (b"GET /healthz HTTP/1.0\r\n\r\n", 0, [200]),
    "connection_close": (
        _request("GET", "/healthz", b"", "Connection: close") + _request("GET", "/healthz"),
        0,
        [200],
    ),
    "many_headers": (_request("GET", "/healthz", b"", *[f"X-{i}: v" for i in range(30)]), 0, [431]),
    "head_too_large": (_request("GET", "/healthz", b"", "X-Pad: " + "p" * 2100), 0, [431]),
    "head_framed_two_ways": (
        _request(
            "HEAD", "/v1/audio/speech", b"", "Content-Length: 4", "Transfer-Encoding: chunked"
        ),
        0,
        [400],
    ),
    "head_too_many_headers": (
        _request("HEAD", "/healthz", b"", *[f"X-{i}: v" for i in range(30)]),
        0,
        [431],
    ),
    "bad_request_line": (b"GET /\x00 HTTP/1.1\r\n\r\n", 0, [400]),
    "body_cut_short": (_speech()[:-10], 0, []),
    "head_cut_short": (b"GET /healthz HTTP/1.1\r\nHo", 0, [400]),
    "empty": (b"", 0, []),
}


def build() -> dict[Path, bytes]:
    """Every seed file and its bytes, each checked by its harness's oracle."""
    files: dict[Path, bytes] = {}
    for name, data in CONTROL_SEEDS.items():
        check_control_message(data)
        files[CORPUS / "control" / name] = data
    for name, (program, outcome) in SESSION_SEEDS.items():
        data = program().to_bytes()
        report = check_session_program(data)
        if report.outcome != outcome:
            raise SystemExit(f"session seed {name}: outcome {report.outcome!r}, not {outcome!r}")
        files[CORPUS / "session" / name] = data
    for name, (client, how, outcome, close) in WIRE_SEEDS.items():
        data = encode_wire_input(client, **how)
        wire = check_wire_input(data)
        if (wire.outcome, wire.close_code) != (outcome, close):
            got = (wire.outcome, wire.close_code)
            raise SystemExit(f"wire seed {name}: {got}, not {(outcome, close)}")
        files[CORPUS / "wire" / name] = data
    for name, (client, chunk_size, statuses) in HTTP_SEEDS.items():
        data = encode_http_input(client, chunk_size=chunk_size)
        got = [r.status for r in check_http_input(data).responses]
        if got != statuses:
            raise SystemExit(f"http seed {name}: statuses {got}, not {statuses}")
        files[CORPUS / "http" / name] = data
    return files


def main(argv: list[str]) -> int:
    files = build()
    if "--check" in argv:
        stale = [p for p, data in files.items() if not p.exists() or p.read_bytes() != data]
        for stale_path in stale:
            print(f"stale seed: {stale_path}")
        return 1 if stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    print(f"wrote {len(files)} seeds under {CORPUS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
