"""Model archives pinned by SHA-256: download, verification, confined unpacking, atomic
placement, and every refusal leaving nothing behind. All offline: the archives are built here
and served over https from 127.0.0.1 with a throwaway CA (trustme)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from talkies.engines.supply import archive as archive_mod
from talkies.engines.supply import download
from talkies.engines.supply.download import DownloadError, ensure_snapshot, is_downloaded, source_of
from talkies.engines.supply.registry import ModelEntry, entry_from_json, is_https_url
from talkies.engines.vosk import check_model_dir

ROOT = Path(__file__).resolve().parent.parent
TOP = "vosk-model-small-en-us-0.15"
# A Vosk-shaped tree (the layout of the real small English model, tiny contents).
VOSK_FILES = {
    "README": b"US English model for mobile Vosk applications\n",
    "am/final.mdl": b"\x00mdl" * 100,
    "conf/mfcc.conf": b"--use-energy=false\n",
    "conf/model.conf": b"--min-active=200\n",
    "graph/HCLr.fst": b"hclr" * 50,
    "graph/Gr.fst": b"gr" * 50,
    "graph/disambig_tid.int": b"1\n",
    "graph/phones/word_boundary.int": b"1 nonword\n",
    "ivector/final.ie": b"ie",
}


# -- building archives ---------------------------------------------------------------------


def _zip(files: dict[str, bytes], *, top: str | None = TOP) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        if top:
            z.writestr(f"{top}/", b"")
        for name, data in files.items():
            z.writestr(f"{top}/{name}" if top else name, data)
    return buf.getvalue()


def _zip_symlink(name: str, target: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def _tgz(files: dict[str, bytes], extra: Sequence[tarfile.TarInfo] = (), top: str = TOP) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        d = tarfile.TarInfo(top)
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for info in extra:
            t.addfile(info)
    return buf.getvalue()


def _tar_link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- an https server on 127.0.0.1 ----------------------------------------------------------


@dataclass
class Site:
    port: int
    routes: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes, how: str = "ok") -> str:
        self.routes[path] = (how, body)
        return self.url(path)


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            site.hits.append(self.path)
            how, body = site.routes.get(self.path, ("missing", b""))
            if how == "missing":
                self.send_error(404)
                return
            if how == "redirect":
                self.send_response(302)
                self.send_header("Location", body.decode())
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if how == "cut":  # the server hangs up half-way
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
            elif how == "stall":  # sends a little, then nothing
                self.wfile.write(body[:10])
                self.wfile.flush()
                site.release.wait(10)
                self.close_connection = True
            else:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    pem = tmp_path_factory.mktemp("ca") / "ca.pem"
    authority.cert_pem.write_to_path(str(pem))
    return authority, pem


@pytest.fixture
def site(ca: tuple[trustme.CA, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    authority, pem = ca
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))  # read when the download builds its context
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    site = Site(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.release.set()
        server.shutdown()
        server.server_close()


def _entry(url: str, sha256: str, slug: str = "vosk-test") -> ModelEntry:
    return ModelEntry(slug=slug, executor="vosk", url=url, sha256=sha256)


def _nothing_left(data: Path) -> None:
    assert list((data / "models").iterdir()) == []


# -- the good path ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_archive_is_verified_unpacked_stripped_and_marked(
    site: Site, tmp_path: Path, kind: str
) -> None:
    body = _zip(VOSK_FILES) if kind == "zip" else _tgz(VOSK_FILES)
    entry = _entry(site.serve(f"/m.{kind}", body), _sha(body))
    data = tmp_path / "data"
    assert not is_downloaded(entry, data)
    root = ensure_snapshot(entry, data)
    assert root == data / "models" / "vosk-test"
    assert sorted(p.name for p in (data / "models").iterdir()) == ["vosk-test"]  # no staging
    for name, content in VOSK_FILES.items():
        assert (root / name).read_bytes() == content
    assert not (root / TOP).exists() and not (root / "archive").exists()
    assert (root / ".talkies-revision").read_text().strip() == f"sha256:{_sha(body)}"
    assert entry.pin == f"sha256:{_sha(body)}" and is_downloaded(entry, data)
    check_model_dir("vosk-test", root)  # the folder is a Vosk root
    hits = len(site.hits)
    assert ensure_snapshot(entry, data) == root and len(site.hits) == hits  # no refetch
    assert source_of(entry) == f"{entry.url}@sha256:{_sha(body)[:12]}"


def test_a_new_pin_replaces_the_old_folder(site: Site, tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = _zip({"am/final.mdl": b"old"})
    ensure_snapshot(_entry(site.serve("/old.zip", old), _sha(old)), data)
    new = _zip({"am/final.mdl": b"new"})
    root = ensure_snapshot(_entry(site.serve("/new.zip", new), _sha(new)), data)
    assert (root / "am" / "final.mdl").read_bytes() == b"new"
    assert sorted(p.name for p in (data / "models").iterdir()) == ["vosk-test"]


def test_archives_without_one_top_folder_are_kept_as_they_are(site: Site, tmp_path: Path) -> None:
    body = _zip({"a/x.txt": b"1", "b/y.txt": b"2"}, top=None)
    root = ensure_snapshot(_entry(site.serve("/flat.zip", body), _sha(body)), tmp_path)
    assert (root / "a" / "x.txt").read_bytes() == b"1" and (root / "b" / "y.txt").exists()


def test_links_inside_the_archive_become_copies(site: Site, tmp_path: Path) -> None:
    links = [
        _tar_link(f"{TOP}/graph/HCLG.fst", "HCLr.fst"),  # symbolic: relative to its folder
        _tar_link(f"{TOP}/am/copy.mdl", f"{TOP}/am/final.mdl", tarfile.LNKTYPE),  # hard
    ]
    body = _tgz(VOSK_FILES, links)
    root = ensure_snapshot(_entry(site.serve("/links.tgz", body), _sha(body)), tmp_path)
    for name, source in (("graph/HCLG.fst", "graph/HCLr.fst"), ("am/copy.mdl", "am/final.mdl")):
        assert not (root / name).is_symlink()
        assert (root / name).read_bytes() == VOSK_FILES[source]


# -- refusals: nothing is left behind ----------------------------------------------------------


def _refused(site: Site, data: Path, body: bytes, sha: str | None = None, how: str = "ok") -> str:
    entry = _entry(site.serve("/bad", body, how), sha or _sha(body))
    with pytest.raises(DownloadError) as failed:
        ensure_snapshot(entry, data)
    _nothing_left(data)
    assert not is_downloaded(entry, data)
    return str(failed.value)


def test_a_wrong_hash_is_refused_before_unpacking(site: Site, tmp_path: Path) -> None:
    body = _zip(VOSK_FILES)
    message = _refused(site, tmp_path, body, sha="0" * 64)
    assert f"has SHA-256 {_sha(body)}, expected {'0' * 64}" in message
    assert "nothing was unpacked" in message and message.startswith("model 'vosk-test'")


def test_a_transfer_cut_short_is_refused(site: Site, tmp_path: Path) -> None:
    body = _zip(VOSK_FILES)
    message = _refused(site, tmp_path, body, how="cut")
    assert f"ended after {len(body) // 2} of {len(body)} bytes" in message
    assert "talkies models pull vosk-test" in message


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_truncated_archive_is_refused(site: Site, tmp_path: Path, kind: str) -> None:
    whole = _zip(VOSK_FILES) if kind == "zip" else _tgz(VOSK_FILES)
    body = whole[: len(whole) * 2 // 3]  # pinned as it is: the hash matches, the archive not
    message = _refused(site, tmp_path, body)
    assert "cannot be unpacked" in message, message
    assert "truncated" in message or "corrupt" in message, message


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x", "'..' component"),
        (f"{TOP}/../../x", "'..' component"),
        ("/etc/x", "absolute path"),
        ("C:/x", "absolute path"),
        (f"{TOP}\\..\\..\\x", "'..' component"),
    ],
)
def test_members_outside_the_folder_are_refused(
    site: Site, tmp_path: Path, name: str, why: str
) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{TOP}/am/final.mdl", b"m")
        z.writestr(zipfile.ZipInfo(name), b"evil")
    message = _refused(site, tmp_path, buf.getvalue())
    assert why in message and repr(name) in message, message
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_tar_members_outside_the_folder_are_refused(site: Site, tmp_path: Path) -> None:
    for name in ("../x", "/abs/x"):
        evil = tarfile.TarInfo(name)
        message = _refused(site, tmp_path, _tgz(VOSK_FILES, [evil]))
        assert repr(name) in message, message


@pytest.mark.parametrize(
    "target", ["../../outside", "/etc/passwd", "../../../../../../etc/passwd", "../graph"]
)
def test_links_pointing_out_or_at_folders_are_refused(
    site: Site, tmp_path: Path, target: str
) -> None:
    link = _tar_link(f"{TOP}/am/link", target)
    message = _refused(site, tmp_path, _tgz(VOSK_FILES, [link]))
    assert "is a link that does not point at a file in the archive" in message, message
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{TOP}/am/final.mdl", b"m")
        z.writestr(_zip_symlink(f"{TOP}/am/link", target), target)
    message = _refused(site, tmp_path, buf.getvalue())
    assert "is a link that does not point at a file in the archive" in message, message


def test_a_file_cannot_be_written_through_an_earlier_link(site: Site, tmp_path: Path) -> None:
    link = _tar_link(f"{TOP}/up", "README")  # a good link, then a member "through" it
    through = tarfile.TarInfo(f"{TOP}/up/x")
    message = _refused(site, tmp_path, _tgz(VOSK_FILES, [link, through]))
    assert "inside a file or link" in message, message


def test_devices_and_fifos_are_refused(site: Site, tmp_path: Path) -> None:
    for kind in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
        device = tarfile.TarInfo(f"{TOP}/dev")
        device.type = kind
        message = _refused(site, tmp_path, _tgz(VOSK_FILES, [device]))
        assert "device, FIFO" in message, message
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo(f"{TOP}/dev")
        info.create_system = 3
        info.external_attr = (stat.S_IFCHR | 0o600) << 16
        z.writestr(info, b"")
    assert "device, FIFO" in _refused(site, tmp_path, buf.getvalue())


def test_duplicates_and_files_used_as_folders_are_refused(site: Site, tmp_path: Path) -> None:
    dup = tarfile.TarInfo(f"{TOP}/README")
    assert "appears twice" in _refused(site, tmp_path, _tgz(VOSK_FILES, [dup]))
    inside = tarfile.TarInfo(f"{TOP}/README/x")
    assert "inside a file" in _refused(site, tmp_path, _tgz(VOSK_FILES, [inside]))


def test_not_an_archive_is_refused(site: Site, tmp_path: Path) -> None:
    message = _refused(site, tmp_path, b"<html>not found</html>")
    assert "neither a zip nor a tar archive" in message


def test_size_caps(site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _zip(VOSK_FILES)
    monkeypatch.setattr(download, "MAX_ARCHIVE_BYTES", len(body) - 1)
    assert f"more than {len(body) - 1}" in _refused(site, tmp_path, body)
    monkeypatch.setattr(download, "MAX_ARCHIVE_BYTES", 1 << 30)
    big = _zip({"am/final.mdl": b"\0" * 100_000})
    monkeypatch.setattr(archive_mod, "MAX_UNPACKED_BYTES", 50_000)
    assert "unpacks to 100000 bytes, more than 50000" in _refused(site, tmp_path, big)
    monkeypatch.setattr(archive_mod, "MAX_MEMBERS", 3)
    assert "members, more than 3" in _refused(site, tmp_path, _zip(VOSK_FILES))


def test_http_errors_and_redirects_off_https(site: Site, tmp_path: Path) -> None:
    entry = _entry(site.url("/missing.zip"), "0" * 64)
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1 answered HTTP 404"):
        ensure_snapshot(entry, tmp_path)
    _nothing_left(tmp_path)
    site.serve("/moved", b"http://127.0.0.1:1/m.zip", "redirect")
    with pytest.raises(DownloadError, match="which is not https"):
        ensure_snapshot(_entry(site.url("/moved"), "0" * 64), tmp_path)
    _nothing_left(tmp_path)
    body = _zip(VOSK_FILES)
    site.serve("/real.zip", body)
    site.serve("/moved2", site.url("/real.zip").encode(), "redirect")
    assert ensure_snapshot(_entry(site.url("/moved2"), _sha(body)), tmp_path).is_dir()


def test_a_stalled_transfer_ends(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "_READ_TIMEOUT", 0.3)
    started = time.monotonic()
    message = _refused(site, tmp_path, _zip(VOSK_FILES), how="stall")
    assert time.monotonic() - started < 5
    assert "failed after 10 bytes" in message and "TimeoutError" in message, message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_host_fails_fast_and_clearly(tmp_path: Path) -> None:
    entry = _entry(f"https://127.0.0.1:{_closed_port()}/m.zip", "0" * 64)
    started = time.monotonic()
    with pytest.raises(DownloadError) as failed:
        ensure_snapshot(entry, tmp_path)
    assert time.monotonic() - started < 5
    message = str(failed.value)
    assert "model 'vosk-test' could not be downloaded: 127.0.0.1 is unreachable" in message
    assert "talkies models pull vosk-test" in message and "'path' entry" in message
    assert "\n" not in message
    _nothing_left(tmp_path)


def test_a_host_that_never_answers_fails_within_the_connect_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "_CONNECT_TIMEOUT", 0.5)
    with socket.socket() as silent:  # accepts TCP (in the backlog), never speaks TLS
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        entry = _entry(f"https://127.0.0.1:{silent.getsockname()[1]}/m.zip", "0" * 64)
        started = time.monotonic()
        with pytest.raises(DownloadError, match="is unreachable"):
            ensure_snapshot(entry, tmp_path)
        assert time.monotonic() - started < 3
    _nothing_left(tmp_path)


def test_offline_mode_fetches_nothing(site: Site, tmp_path: Path) -> None:
    entry = _entry(site.serve("/m.zip", b"x"), _sha(b"x"))
    with pytest.raises(DownloadError, match="downloads are off"):
        ensure_snapshot(entry, tmp_path, local_files_only=True)
    assert site.hits == []


def test_only_https_is_ever_fetched(tmp_path: Path) -> None:
    entry = _entry("http://127.0.0.1:1/m.zip", "0" * 64)
    with pytest.raises(DownloadError, match="is not an https URL"):
        ensure_snapshot(entry, tmp_path)


# -- the registry --------------------------------------------------------------------------------


def test_url_entries_are_validated(tmp_path: Path) -> None:
    good = {"executor": "vosk", "url": "https://example.org/m.zip", "sha256": "a" * 64}
    entry, problems = entry_from_json("m1", good, tmp_path)
    assert problems == [] and entry is not None and entry.pin == f"sha256:{'a' * 64}"
    cases: list[tuple[dict[str, object], str]] = [
        ({**good, "url": "http://example.org/m.zip"}, "url must be an https:// URL"),
        ({**good, "url": "https:///m.zip"}, "url must be an https:// URL"),
        ({**good, "url": "https://user:pw@example.org/m.zip"}, "url must be an https:// URL"),
        ({**good, "url": "https://example.org/m .zip"}, "url must be an https:// URL"),
        ({**good, "url": "ftp://example.org/m.zip"}, "url must be an https:// URL"),
        ({**good, "sha256": "A" * 64}, "64 lowercase hex"),
        ({**good, "sha256": "a" * 63}, "64 lowercase hex"),
        ({"executor": "vosk", "url": good["url"]}, "64 lowercase hex"),
        ({"executor": "vosk", "path": ".", "sha256": "a" * 64}, "sha256 is only meaningful"),
        ({**good, "repo": "a/b", "revision": "c" * 40}, "exactly one of"),
        ({**good, "path": "."}, "exactly one of"),
        ({**good, "allow_patterns": ["*.onnx"]}, "allow_patterns is only meaningful"),
        ({**good, "url": 5}, "field 'url' has the wrong JSON type"),
    ]
    for raw, message in cases:
        _, problems = entry_from_json("m1", raw, tmp_path)
        assert any(message in p and "'m1'" in p for p in problems), (raw, problems)
    assert is_https_url("https://127.0.0.1:8443/x.zip")
    assert not is_https_url("https://example.org:notaport/x.zip")


def test_pull_from_a_models_file_entry(site: Site, tmp_path: Path) -> None:
    """`talkies models pull` of a models.json url entry, in a process of its own."""
    body = _zip(VOSK_FILES)
    models = tmp_path / "models.json"
    entry = {"executor": "vosk", "url": site.serve("/v.zip", body), "sha256": _sha(body)}
    models.write_text(json.dumps({"models": {"my-vosk": entry}}))
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env.update(PYTHONPATH=str(ROOT), TALKIES_DATA_DIR=str(data), TALKIES_MODELS_FILE=str(models))
    result = subprocess.run(
        [sys.executable, "-m", "talkies", "models", "pull", "my-vosk"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"my-vosk: {data / 'models' / 'my-vosk'}"
    listing = subprocess.run(
        [sys.executable, "-m", "talkies", "models", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = {r["model"]: r for r in map(json.loads, listing.stdout.splitlines())}
    assert rows["my-vosk"]["downloaded"] is True
    assert rows["my-vosk"]["source"].startswith(site.url("/v.zip") + "@sha256:")
    assert rows["vosk-small-en-us-0.15"]["downloaded"] is False


# -- through the pool ------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_pool_loads_a_url_entry_and_reports_a_failed_one(
    site: Site, tmp_path: Path
) -> None:
    from talkies.config import Settings
    from talkies.engines.base import EngineUnavailable
    from talkies.engines.pool import ModelPool
    from talkies.protocol.messages import StartOptions

    from .test_engine_pool import Loads

    body = _zip(VOSK_FILES)
    entries = {
        "good": _entry(site.serve("/p.zip", body), _sha(body), slug="good"),
        "bad": _entry(f"https://127.0.0.1:{_closed_port()}/m.zip", "0" * 64, slug="bad"),
    }
    loads = Loads()
    pool = ModelPool(entries, Settings(data_dir=tmp_path), loader=loads, validate=False)
    with pytest.raises(EngineUnavailable, match=r"'bad' could not be downloaded: 127\.0\.0\.1"):
        await pool.open_stream(StartOptions(model="bad"))
    stream = await pool.open_stream(StartOptions(model="good"))
    await stream.aclose()
    assert loads.log == ["load good"]
    rows = {r["model"]: r for r in pool.status()}
    assert rows["good"]["downloaded"] is True and rows["bad"]["downloaded"] is False
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["good"]
