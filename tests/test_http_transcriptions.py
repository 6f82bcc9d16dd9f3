"""POST /v1/audio/transcriptions and staged files, identical on both hosts, with real clients
(the OpenAI Python SDK, curl, httpx, raw sockets) and real models."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from .fake_engine import silence, speech, write_wav
from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import POCKETSPHINX_DATA, normalize_words
from .wire import START, ws_connect

pytestmark = pytest.mark.usefixtures("http_data")

GOFORWARD = ["go", "forward", "ten", "meters"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not (POCKETSPHINX_DATA / "goforward.raw").is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    folder = tmp_path_factory.mktemp("clips")
    out = {
        "goforward": write_wav(
            folder / "goforward.wav", (POCKETSPHINX_DATA / "goforward.raw").read_bytes()
        )
    }
    out["0870"] = POCKETSPHINX_DATA / "librivox" / "sense_and_sensibility_01_austen_64kb-0870.wav"
    out["energy"] = write_wav(folder / "energy.wav", speech(1.0) + silence(1.0) + speech(0.5))
    out["long"] = write_wav(folder / "long.wav", speech(4.0))
    out["holder"] = write_wav(folder / "holder.wav", speech(1.0))
    return out


def _sdk(host: HttpHost) -> openai.OpenAI:
    return openai.OpenAI(api_key=TOKEN, base_url=host.url + "/v1", max_retries=0, timeout=120)


def test_openai_sdk_retrieves_a_model_and_lists_them(host: HttpHost) -> None:
    """``client.models.retrieve`` (GET /v1/models/{id}: it was 405) gives the row the list
    has; an unknown id is OpenAI's 404."""
    client = _sdk(host)
    listed = {m.id: m for m in client.models.list().data}
    assert listed
    slug = next(iter(listed))
    one = client.models.retrieve(slug)
    assert one.id == slug and one.object == "model" and one.owned_by == "talkies"
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("no-such-model")
    assert refused.value.code == "model_not_found"


def test_openai_sdk_every_format_on_real_english(host: HttpHost, clips: dict[str, Path]) -> None:
    client = _sdk(host)
    with clips["goforward"].open("rb") as f:
        result = client.audio.transcriptions.create(model="whisper-base-en", file=f)
    assert normalize_words(result.text) == GOFORWARD
    with clips["goforward"].open("rb") as f:
        text = client.audio.transcriptions.create(
            model="whisper-base-en", file=f, response_format="text"
        )
    assert isinstance(text, str) and normalize_words(text) == GOFORWARD
    with clips["0870"].open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-base-en",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    reference = (
        "and mister john dashwood had then leisure to consider how much there might be "
        "prudently in his power to do for them"
    )
    assert normalize_words(verbose.text) == reference.split()
    assert verbose.language == "english" and verbose.task == "transcribe"
    assert verbose.duration == pytest.approx(7.1, abs=0.05)
    assert verbose.segments and verbose.words
    assert all(0 <= s.start < s.end <= verbose.duration + 0.01 for s in verbose.segments)
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in verbose.words)
    assert normalize_words(" ".join(w.word for w in verbose.words)) == reference.split()
    for fmt, stamp in (("srt", r"\d\d:\d\d:\d\d,\d\d\d"), ("vtt", r"\d\d:\d\d:\d\d\.\d\d\d")):
        with clips["goforward"].open("rb") as f:
            cues = client.audio.transcriptions.create(
                model="whisper-base-en", file=f, response_format=fmt
            )
        assert isinstance(cues, str)
        assert re.search(rf"{stamp} --> {stamp}", cues), cues
        assert (
            normalize_words(re.sub(rf"{stamp} --> {stamp}|^\d+$|WEBVTT", " ", cues, flags=re.M))
            == GOFORWARD
        )
        if fmt == "vtt":
            assert cues.startswith("WEBVTT")


def test_korean_vosk_gives_words_with_times(host: HttpHost, tmp_path: Path) -> None:
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng is not installed")
    wav = tmp_path / "ko.wav"
    subprocess.run(["espeak-ng", "-v", "ko", "-w", str(wav), "안녕하세요 반갑습니다"], check=True)
    with wav.open("rb") as f:
        verbose = _sdk(host).audio.transcriptions.create(
            model="vosk-ko",
            file=f,
            language="ko",  # Vosk cannot tell which language it heard: the client says
            response_format="verbose_json",
            timestamp_granularities=["word"],
        )
    assert verbose.language == "korean" and verbose.text.strip()
    assert verbose.words and all(0 <= w.start <= w.end <= verbose.duration for w in verbose.words)


def test_random_sherpa_model_answers_in_shape(host: HttpHost, clips: dict[str, Path]) -> None:
    with host.client() as client, clips["energy"].open("rb") as f:
        r = client.post(
            "/v1/audio/transcriptions",
            data={"model": "sherpa-random", "response_format": "verbose_json"},
            files={"file": ("energy.wav", f, "audio/wav")},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["duration"] == pytest.approx(2.5, abs=0.01)
    assert set(body) >= {"task", "language", "duration", "text", "segments"}


def test_curl_form_upload(host: HttpHost, clips: dict[str, Path]) -> None:
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    out = subprocess.run(
        ["curl", "-sS", "--fail-with-body", host.url + "/v1/audio/transcriptions",
         "-H", f"Authorization: Bearer {TOKEN}",
         "-F", f"file=@{clips['goforward']}", "-F", "model=whisper-base-en"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert normalize_words(json.loads(out.stdout)["text"]) == GOFORWARD


def test_staged_files(host: HttpHost, clips: dict[str, Path]) -> None:
    name = f"staged-{host.name}/go forward.wav"
    data = clips["goforward"].read_bytes()
    with host.client() as client:
        put = client.put(f"/v1/files/{name}", content=data)
        assert put.status_code == 201 and put.json()["bytes"] == len(data)
        listed = {row["id"]: row for row in client.get("/v1/files").json()["data"]}
        assert listed[name]["bytes"] == len(data)
        got = client.get(f"/v1/files/{name}")
        assert got.status_code == 200 and got.content == data
        r = client.post(
            "/v1/audio/transcriptions", data={"model": "whisper-base-en", "file_path": name}
        )
        assert r.status_code == 200 and normalize_words(r.json()["text"]) == GOFORWARD
        assert client.delete(f"/v1/files/{name}").status_code == 200
        assert client.get(f"/v1/files/{name}").status_code == 404
        gone = client.post(
            "/v1/audio/transcriptions", data={"model": "whisper-base-en", "file_path": name}
        )
        assert gone.status_code == 404 and gone.json()["error"]["param"] == "file_path"


@pytest.mark.parametrize(
    "path",
    [
        "../escape.wav",
        "a/../../escape.wav",
        "%2e%2e/escape.wav",
        "/abs.wav",
        "a//b.wav",
        "a/./b.wav",
        "nul%00.wav",
        "back%5Cslash.wav",
        "x" * 256 + ".wav",
        "/".join(["d" * 200] * 6),
        "%ff.wav",
    ],
)
def test_file_path_tricks_are_400(host: HttpHost, path: str) -> None:
    # A raw request line: HTTP clients would normalize ".." and "." away before sending.
    request = (
        f"PUT /v1/files/{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 4\r\nConnection: close\r\n\r\nRIFF"
    ).encode()
    with socket.create_connection(("127.0.0.1", host.port), timeout=10) as sock:
        sock.sendall(request)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), (path, head)
    assert json.loads(body)["error"]["message"].startswith("invalid file path"), body
    assert not (host.data_dir / "escape.wav").exists()
    assert not (host.data_dir.parent / "escape.wav").exists()


def test_a_symlink_out_of_the_files_folder_is_refused(host: HttpHost, tmp_path: Path) -> None:
    files = host.data_dir / "files"
    files.mkdir(exist_ok=True)
    link = files / f"out-{host.name}"
    link.symlink_to(tmp_path, target_is_directory=True)
    with host.client() as client:
        r = client.put(f"/v1/files/out-{host.name}/x.wav", content=b"RIFF")
        assert r.status_code == 400 and "outside" in r.json()["error"]["message"]
        r = client.post(
            "/v1/audio/transcriptions",
            data={"model": "whisper-base-en", "file_path": f"out-{host.name}/x.wav"},
        )
        assert r.status_code == 400
    assert list(tmp_path.iterdir()) == []


def _post_in_background(
    host: HttpHost, path: Path, model: str
) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        with host.client() as client, path.open("rb") as f:
            r = client.post(
                "/v1/audio/transcriptions",
                data={"model": model},
                files={"file": (path.name, f, "audio/wav")},
            )
            result["status"] = r.status_code

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_full_model_answers_429_at_once(host: HttpHost, clips: dict[str, Path]) -> None:
    thread, first = _post_in_background(host, clips["holder"], "energy-slow-test")
    host.wait_in_use("energy-slow-test", 1)
    started = time.monotonic()
    with host.client() as client, clips["energy"].open("rb") as f:
        r = client.post(
            "/v1/audio/transcriptions",
            data={"model": "energy-slow-test"},
            files={"file": ("e.wav", f, "audio/wav")},
        )
    assert r.status_code == 429 and time.monotonic() - started < 2.0
    assert r.json()["error"]["type"] == "rate_limit_error"
    thread.join(60)
    assert first["status"] == 200
    host.wait_in_use("energy-slow-test", 0)


def test_another_model_pinned_by_a_stream_is_409(host: HttpHost, clips: dict[str, Path]) -> None:
    ws = ws_connect(host.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
    ws.send(json.dumps({**START, "model": "energy-test"}))
    assert json.loads(ws.recv(timeout=30))["type"] == "ready"
    try:
        with host.client() as client, clips["goforward"].open("rb") as f:
            r = client.post(
                "/v1/audio/transcriptions",
                data={"model": "whisper-base-en"},
                files={"file": ("g.wav", f, "audio/wav")},
            )
        assert r.status_code == 409 and "energy-test" in r.json()["error"]["message"]
    finally:
        ws.send(json.dumps({"type": "cancel"}))
        ws.close()
    host.wait_in_use("energy-test", 0)


def _multipart_head(boundary: str, content_length: int) -> bytes:
    return (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {content_length}\r\n\r\n"
    ).encode()


def _form(boundary: str, model: str, audio: bytes) -> bytes:
    return (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )


def test_a_client_leaving_mid_decode_frees_the_slot(host: HttpHost, clips: dict[str, Path]) -> None:
    body = _form("b0undary", "energy-slow-test", clips["long"].read_bytes())
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=10)
    sock.sendall(_multipart_head("b0undary", len(body)) + body)
    host.wait_in_use("energy-slow-test", 1)
    sock.close()
    started = time.monotonic()
    host.wait_in_use("energy-slow-test", 0, timeout=5)
    # The decode would have taken 40 steps x 0.5 s; it stopped within about one step.
    assert time.monotonic() - started < 3.0


def test_a_client_leaving_mid_upload_leaves_no_temp_file(
    host: HttpHost, clips: dict[str, Path]
) -> None:
    body = _form("b0undary", "whisper-base-en", clips["long"].read_bytes())
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=10)
    sock.sendall(_multipart_head("b0undary", len(body)) + body[: len(body) // 2])
    time.sleep(0.5)
    sock.close()
    deadline = time.monotonic() + 5
    tmp = host.data_dir / "tmp"
    while tmp.is_dir() and any(tmp.iterdir()):
        assert time.monotonic() < deadline, list(tmp.iterdir())
        time.sleep(0.05)
