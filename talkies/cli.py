"""``talkies`` command line: ``talkies serve``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence

import anyio

from . import __version__
from .config import ConfigError, Settings
from .logs import configure
from .transport.server import Server, ServerOptions

__all__ = ["main"]

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
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    return parser


def _ssl_context(certfile: str, keyfile: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def _serve(server: Server, grace: float) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("shutting down", extra={"signal": signal.Signals(signum).name})
                await server.shutdown(grace)
                break


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure(args.log_level)
    try:
        settings = Settings.from_env(os.environ)
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        if overrides:
            settings = settings.with_overrides(**overrides)
    except ConfigError as exc:
        sys.stderr.write(f"talkies: invalid configuration:\n{exc}\n")
        return 2
    if args.keyfile and not args.certfile:
        sys.stderr.write("talkies: --keyfile needs --certfile\n")
        return 2
    context = _ssl_context(args.certfile, args.keyfile) if args.certfile else None
    server = Server(settings, ssl_context=context, options=ServerOptions(shutdown_grace=args.grace))
    anyio.run(_serve, server, args.grace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
