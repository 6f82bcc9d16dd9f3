"""HEALTHCHECK of the Talkies images: ``GET /healthz`` on the server's own port.

The slim base image has no curl, so this is Python from the image's own virtual environment.
/healthz is liveness only (the process answers HTTP); whether the server can take another
stream is /readyz, which a full server answers with 503 and which must not make Docker or an
orchestrator restart it. Exit status 0 when /healthz answers 200, 1 otherwise.
``HEALTHCHECK_URL`` overrides the URL (for example ``https://127.0.0.1:8000/healthz``
for a server started with ``--certfile``; its certificate is not checked on loopback); it is
not named TALKIES_*, since the server refuses unknown TALKIES_* variables in its environment.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("TALKIES_PORT", "8000")
    url = os.environ.get("HEALTHCHECK_URL", f"http://127.0.0.1:{port}/healthz")
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:
        sys.stderr.write(f"unhealthy: {url}: {exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
