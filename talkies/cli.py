"""``talkies`` command line: ``serve``; ``stream``, ``transcribe``, ``speak`` (a client of a
running server); ``models list|pull|import-ct2``."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from . import __version__, heap
from .config import ConfigError, Settings
from .engines.supply.registry import RegistryError
from .logs import configure

__all__ = ["main", "page_url"]

log = logging.getLogger("talkies")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="talkies", description="Talkies live speech server")
    parser.add_argument("--version", action="version", version=f"talkies {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server (settings from TALKIES_* variables)")
    serve.add_argument("--host", help="listen address (default: TALKIES_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: TALKIES_PORT or 8000)")
    serve.add_argument("--certfile", help="PEM certificate: serve wss:// and https://")
    serve.add_argument("--keyfile", help="PEM private key for --certfile")
    serve.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds active streams may finish after SIGTERM/SIGINT (default 10)",
    )
    serve.add_argument(
        "--wyoming",
        metavar="URI",
        help="also serve Wyoming (Home Assistant) on tcp://HOST:PORT (TALKIES_WYOMING_URI)",
    )
    serve.add_argument(
        "--wyoming-zeroconf",
        metavar="NAME",
        nargs="?",
        const="talkies",
        help="advertise the Wyoming server over zeroconf as NAME (default talkies) so Home "
        "Assistant discovers it (TALKIES_WYOMING_ZEROCONF)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])

    default_url = "http://127.0.0.1:8000"
    stream = sub.add_parser(
        "stream", help="stream an audio file (or - for stdin) to a server, showing the transcript"
    )
    stream.add_argument("source", help="any audio ffmpeg reads, or - for standard input")
    stream.add_argument("--url", default=default_url, help=f"server (default {default_url})")
    stream.add_argument("--model", default=None, help="model slug (default whisper-base-en)")
    stream.add_argument("--language", help="language tag, or auto")
    stream.add_argument("--fast", action="store_true", help="send as fast as the server takes it")
    stream.add_argument("--json", action="store_true", help="print the raw events, one per line")
    transcribe = sub.add_parser("transcribe", help="transcribe a file over HTTP")
    transcribe.add_argument("source")
    transcribe.add_argument("--url", default=default_url)
    transcribe.add_argument("--model", default=None, help="model slug (default whisper-base-en)")
    transcribe.add_argument("--language")
    transcribe.add_argument(
        "--format", default="text", choices=["json", "text", "verbose_json", "srt", "vtt"]
    )
    speak = sub.add_parser("speak", help="synthesize speech and play it or write it to a file")
    speak.add_argument("text")
    speak.add_argument("--url", default=default_url)
    speak.add_argument("--model", default="piper-en-us-joe")  # the offline English voice
    speak.add_argument("--voice", default="alloy")
    speak.add_argument(
        "--format", default="wav", choices=["wav", "pcm", "flac", "mp3", "opus", "aac"]
    )
    speak.add_argument("-o", "--output", help="write here (- for stdout) instead of playing")

    models = sub.add_parser("models", help="list, download or import models")
    msub = models.add_subparsers(dest="models_command", required=True)
    listing = msub.add_parser("list", help="configured models: downloaded? streaming?")
    listing.add_argument("--json", action="store_true", help="one JSON object per model")
    listing.add_argument(
        "--server",
        metavar="URL",
        help="ask a running server (e.g. http://127.0.0.1:8000), which also knows what is loaded",
    )
    pull = msub.add_parser("pull", help="download models now (default: every enabled model)")
    pull.add_argument("slugs", nargs="*")
    imp = msub.add_parser(
        "import-ct2", help="convert a faster-whisper (CTranslate2) Whisper folder and register it"
    )
    imp.add_argument("directory", type=Path)
    imp.add_argument("--slug", required=True)
    imp.add_argument(
        "--replace", action="store_true", help="replace a model imported before under this slug"
    )
    return parser


# How `models list` says each readiness (talkies/engines/readiness.py).
_READINESS = {
    "ready": "ready",
    "needs_download": "needs a download",
    "cannot_run": "cannot run here",
}

# How long `serve` waits, after the grace period and the closing of streams, for the models
# to be unloaded before it exits anyway.
_UNLOAD_SECONDS = 10.0


def page_url(host: str, port: int, *, tls: bool) -> str:
    """The URL to open for a server listening on ``host``:``port``: a wildcard address is
    this machine's loopback, an IPv6 literal goes in brackets."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}/"


class _Problem(Exception):
    """Something the user must fix; printed as one line, exit status 2."""


def _ssl_context(certfile: str, keyfile: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        files = f"--certfile {certfile}" + (f" --keyfile {keyfile}" if keyfile else "")
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _Problem(f"cannot load the TLS certificate and key ({files}): {reason}") from None
    context.set_alpn_protocols(["http/1.1"])
    return context


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env(os.environ)
    pairs = (
        ("host", getattr(args, "host", None)),
        ("port", getattr(args, "port", None)),
        ("wyoming_uri", getattr(args, "wyoming", None)),
        ("wyoming_zeroconf", getattr(args, "wyoming_zeroconf", None)),
    )
    overrides = {k: v for k, v in pairs if v is not None}
    return settings.with_overrides(**overrides) if overrides else settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from .engines.pool import ModelPool
    from .transport.server import ListenError, Server, ServerOptions

    if args.keyfile and not args.certfile:
        raise _Problem("--keyfile needs --certfile")
    pool = ModelPool.from_settings(settings)
    context = _ssl_context(args.certfile, args.keyfile) if args.certfile else None
    server = Server(
        settings, pool, ssl_context=context, options=ServerOptions(shutdown_grace=args.grace)
    )

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)  # with the app's lifespan: TTL sweeper, unloading
            wyoming = None
            if settings.wyoming_zeroconf is not None and settings.wyoming_uri is None:
                log.warning("TALKIES_WYOMING_ZEROCONF is set without a Wyoming server: ignored")
            if settings.wyoming_uri is not None:  # Home Assistant's protocol, same pool
                from .wyoming import WyomingServer

                wyoming = await tg.start(WyomingServer(settings, pool).serve)
            pool.probe_sites()  # in the background: the page says which downloads can happen
            url = page_url(settings.host, server.port or settings.port, tls=context is not None)
            log.info("open %s in a browser", url, extra={"url": url})
            heap.settle()  # start-up's objects out of the collector's sight (heap.py)
            signals_of_interest = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            with anyio.open_signal_receiver(*signals_of_interest) as signals:
                async for signum in signals:
                    if signum == signal.SIGHUP:  # re-read TALKIES_MODELS_FILE and imports
                        pool.refresh()
                        continue
                    log.info("shutting down", extra={"signal": signal.Signals(signum).name})
                    grace = args.grace
                    if wyoming is not None:  # first: its requests use the pool serve() closes
                        began = anyio.current_time()
                        await wyoming.shutdown(grace)
                        grace = max(0.0, grace - (anyio.current_time() - began))
                    await server.shutdown(grace)
                    break
            # serve() returns once the app's lifespan has ended (models unloaded). Bounded: a
            # model's close may wait for work that never ends.
            tg.cancel_scope.deadline = anyio.current_time() + _UNLOAD_SECONDS

    try:
        anyio.run(run)
    except* ListenError as group:
        raise _Problem(str(group.exceptions[0])) from None
    # The interpreter's last garbage collections would walk every object the models left
    # (seconds with torch loaded, after the grace period): nothing is left to collect.
    gc.freeze()
    return 0


def _models(args: argparse.Namespace, settings: Settings) -> int:
    from .engines.pool import ModelPool, build_registry, local_registry_path
    from .engines.supply.download import DownloadError, ensure_snapshot

    if args.models_command == "import-ct2":
        from .engines.supply.importer import ImportProblem, import_ct2

        try:
            entry = import_ct2(
                args.directory,
                args.slug,
                settings.data_dir,
                local_registry_path(settings),
                replace=args.replace,
            )
        except ImportProblem as exc:
            raise _Problem(str(exc)) from None
        sys.stdout.write(
            f"registered {entry.slug} at {entry.path} (a running server picks it up on its "
            "next stream naming it, or on SIGHUP)\n"
        )
        return 0
    registry = build_registry(settings)
    if args.models_command == "list":
        if args.server:
            try:
                rows = _server_models(args.server, settings.auth_token)
            except _Problem as exc:
                sys.stderr.write(f"talkies: {exc}\n")
                return 1
            except (OSError, ValueError, KeyError) as exc:
                sys.stderr.write(f"talkies: could not list the models of {args.server}: {exc}\n")
                return 1
        else:
            pool = ModelPool(registry, settings, validate=False)
            pool.probe_sites(wait=True)  # which download sites answer (seconds at most)
            rows = pool.status()
            for row in rows:
                del row["loaded"], row["in_use"], row["pinned"]  # only a server knows these
        for row in rows:
            if args.json:
                sys.stdout.write(json.dumps(row) + "\n")
            else:
                flags = [
                    "streaming" if row["streaming"] else "offline",
                    "downloaded" if row["downloaded"] else "not downloaded",
                ]
                if "loaded" in row:
                    flags.append("loaded" if row["loaded"] else "not loaded")
                    flags += ["pinned"] if row["pinned"] else []
                if "readiness" in row:  # (a server of an older Talkies has no such column)
                    said = _READINESS.get(row["readiness"], str(row["readiness"]))
                    flags.append(f"{said}: {row['reason']}" if row.get("reason") else said)
                sys.stdout.write(f"{row['model']:40s} {row['executor']:14s} {', '.join(flags)}\n")
        return 0
    slugs = args.slugs or list(registry)
    unknown = [s for s in slugs if s not in registry]
    if unknown:
        sys.stderr.write(f"talkies: unknown models: {', '.join(unknown)}\n")
        return 2
    failed = 0
    for slug in slugs:
        try:
            path = ensure_snapshot(registry[slug], settings.data_dir, progress=True)
        except DownloadError as exc:
            sys.stderr.write(f"talkies: {exc}\n")
            failed += 1
        else:
            sys.stdout.write(f"{slug}: {path}\n")
    return 1 if failed else 0


def _client(args: argparse.Namespace, settings: Settings) -> int:
    from . import client
    from .engines.supply.builtin import DEFAULT_MODEL

    token = settings.auth_token
    try:
        if args.command == "stream":
            client.stream(
                args.source,
                url=args.url,
                model=args.model or DEFAULT_MODEL,
                language=args.language,
                token=token,
                fast=args.fast,
                as_json=args.json,
                out=sys.stdout,
            )
        elif args.command == "transcribe":
            client.transcribe(
                args.source,
                url=args.url,
                model=args.model or DEFAULT_MODEL,
                language=args.language,
                response_format=args.format,
                token=token,
                out=sys.stdout,
            )
        else:
            done = client.speak(
                args.text,
                url=args.url,
                model=args.model,
                voice=args.voice,
                response_format=args.format,
                output=args.output,
                token=token,
            )
            if done:
                sys.stderr.write(done + "\n")
    except client.Interrupted as exc:
        sys.stderr.write(f"talkies: {exc}\n")
        return 130
    except client.ClientError as exc:
        sys.stderr.write(f"talkies: {exc}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside a stream (reading, synthesizing)
        sys.stderr.write("talkies: interrupted\n")
        return 130
    return 0


def _server_models(url: str, token: str | None) -> list[dict[str, Any]]:
    """The rows of a running server's ``GET /v1/models``."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/v1/models")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            data = json.load(response)["data"]
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise _Problem(
                "401: missing or invalid bearer token (set TALKIES_AUTH_TOKEN)"
            ) from None
        raise _Problem(f"{url}: HTTP {exc.code} {exc.reason}") from None
    return [{"model": row.pop("id"), **row} for row in data]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure(getattr(args, "log_level", "warning"))
    try:
        settings = _settings(args)
        if args.command == "serve":
            return _serve(args, settings)
        if args.command in ("stream", "transcribe", "speak"):
            return _client(args, settings)
        return _models(args, settings)
    except ConfigError as exc:
        sys.stderr.write(f"talkies: invalid configuration:\n{exc}\n")
        return 2
    except RegistryError as exc:  # each problem names the setting or file and the slug
        sys.stderr.write("".join(f"talkies: {problem}\n" for problem in exc.problems))
        return 2
    except _Problem as exc:
        sys.stderr.write(f"talkies: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
