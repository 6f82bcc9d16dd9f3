"""Whether the sites model files are downloaded from answer at all, found in the background.

A listing of the models (``GET /v1/models``, the page) says which ones need a download that
cannot happen here. It must answer at once, so it never waits on the network: it reads what
the last probe of each site found, and starts a probe in a thread of its own when there is
none or it is older than ``ttl``. ``talkies serve`` probes every site of its registry when
it starts, so the answers are in by the time someone opens the page.

A probe is one TCP connection to the site's host and port (or to the proxy the environment
names for it) with a short timeout: a connection accepted means the site is reachable; a name
that does not resolve, a refusal or no answer means it is not. No TLS: a probe thread still
loading CA certificates when the server exits meets OpenSSL's exit handler freeing the same
tables, and the process dies of it (seen, one exit in eight, when the server stopped within a
second of starting). With ``HF_HUB_OFFLINE=1`` no download happens at all, so nothing is
probed.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Reach", "SiteAccess", "probe", "site_of"]

# A site that answered, or did not, this long ago is probed again (in the background).
_TTL = 300.0
_TIMEOUT = 5.0

Probe = Callable[[str], "str | None"]


@dataclass(frozen=True, slots=True)
class Reach:
    """What is known of a site: ``reachable``, ``unreachable`` (with ``problem``, one line),
    or ``unknown`` (not probed yet)."""

    state: Literal["reachable", "unreachable", "unknown"]
    problem: str = ""


def site_of(url: str) -> str:
    """The site of ``url``: its scheme and host (and port), what a probe asks."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _address(site: str) -> tuple[str, int, str]:
    """Where a connection to ``site`` goes: its host and port, or its proxy's (as urllib
    reads ``https_proxy``, ``no_proxy``...), and what to call that in a message."""
    parts = urllib.parse.urlsplit(site)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if through.hostname:
            place = f"{through.hostname}:{through.port or 80}"
            return through.hostname, through.port or 80, f"its proxy {place}: "
    return host, port, ""


def probe(site: str) -> str | None:
    """One TCP connection to ``site`` (or its proxy); None when it was accepted, else why
    not (one line)."""
    try:
        host, port, via = _address(site)
    except ValueError as exc:  # a malformed port in the site or the proxy
        return f"ValueError: {exc}"
    try:
        with socket.create_connection((host, port), timeout=_TIMEOUT):
            return None
    except OSError as exc:
        return via + _why(exc)


def _why(reason: object) -> str:
    """A failed connection in a few words."""
    if isinstance(reason, socket.gaierror):
        return "its name does not resolve"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection is refused"
    if isinstance(reason, TimeoutError):
        return f"no answer within {_TIMEOUT:g} s"
    return f"{type(reason).__name__}: {reason}".split("\n", 1)[0][:200]


class SiteAccess:
    """The last probe of each site, refreshed in the background."""

    def __init__(self, *, probe: Probe = probe, ttl: float = _TTL) -> None:
        self._probe = probe
        self._ttl = ttl
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, str | None]] = {}
        self._probing: dict[str, threading.Thread] = {}

    def reach(self, site: str) -> Reach:
        """What the last probe of ``site`` found (starting a new probe when it is stale)."""
        self.probe_later(site)
        with self._lock:
            found = self._known.get(site)
        if found is None:
            return Reach("unknown")
        problem = found[1]
        return Reach("reachable") if problem is None else Reach("unreachable", problem)

    def probe_later(self, site: str) -> threading.Thread | None:
        """Probe ``site`` in a thread of its own unless a probe is running or fresh; the
        thread, or None."""
        with self._lock:
            running = self._probing.get(site)
            if running is not None:
                return running
            found = self._known.get(site)
            if found is not None and time.monotonic() - found[0] < self._ttl:
                return None
            thread = threading.Thread(
                target=self._run, args=(site,), name="talkies-probe", daemon=True
            )
            self._probing[site] = thread
        thread.start()
        return thread

    def check(self, sites: list[str]) -> None:
        """Probe ``sites`` now (in parallel) and wait for the answers (blocking)."""
        threads = [self.probe_later(site) for site in sites]
        for thread in threads:
            if thread is not None:
                thread.join()

    def _run(self, site: str) -> None:
        try:
            problem = self._probe(site)
        except Exception as exc:  # a probe that fails is a site that did not answer
            problem = f"{type(exc).__name__}: {exc}"[:200]
        with self._lock:
            self._known[site] = (time.monotonic(), problem)
            del self._probing[site]
