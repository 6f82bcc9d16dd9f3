"""wss:// and https:// on one port, with a self-signed certificate from trustme."""

from __future__ import annotations

import contextlib
import json
import ssl

import httpx
import trustme

from .conftest import run_server
from .fake_engine import speech
from .wire import drain, open_stream


def test_wss_and_https_share_the_port() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    with run_server(ssl_context=server_ctx) as server:
        url = f"wss://127.0.0.1:{server.port}/v1/audio/transcriptions/stream"
        ws = open_stream(url, ssl=client_ctx)
        ws.send(speech(0.1))
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws)
        assert events[-1]["type"] == "stats" and code == 1000
        r = httpx.get(f"https://127.0.0.1:{server.port}/healthz", verify=client_ctx)
        assert r.status_code == 200
        # Plain HTTP on the TLS port fails, and must not take the server down.
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=2)
        assert httpx.get(f"https://127.0.0.1:{server.port}/healthz", verify=client_ctx).is_success
        server.wait_idle()
