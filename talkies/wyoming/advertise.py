"""Zeroconf (mDNS/DNS-SD) advertisement of the Wyoming server, so Home Assistant discovers it:
a ``_wyoming._tcp.local.`` service under ``TALKIES_WYOMING_ZEROCONF``'s name, as
wyoming-faster-whisper and wyoming-piper advertise themselves.

The ``zeroconf`` package runs its own thread; its blocking calls (registering probes the name
for about 1.5 s) are made from worker threads, never on the event loop.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import logging
import socket
from typing import Any

__all__ = ["SERVICE_TYPE", "AdvertiseError", "Advertisement", "advertised_address"]

log = logging.getLogger("talkies.wyoming")

SERVICE_TYPE = "_wyoming._tcp.local."
_MDNS_GROUP = "224.0.0.251"  # where an mDNS answer goes: the route to it names our address


class AdvertiseError(RuntimeError):
    """The advertisement cannot be made; the message is for the operator."""


def advertised_address(host: str) -> str:
    """The address to advertise for a server listening on ``host``: the address itself, or
    for a wildcard (0.0.0.0, ::) the one this machine reaches the mDNS group from."""
    if host in ("", "0.0.0.0", "::"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((_MDNS_GROUP, 5353))  # UDP: nothing is sent
                return str(probe.getsockname()[0])
            except OSError:
                return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:  # a host name: its first address
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AdvertiseError(f"cannot resolve {host!r} to advertise it: {exc}") from None
    return str(found[0][4][0])


class Advertisement:
    """One ``_wyoming._tcp`` service record, registered until :meth:`unregister`."""

    def __init__(self, name: str, host: str, port: int) -> None:
        try:
            self._zc = importlib.import_module("zeroconf")
        except ImportError:
            raise AdvertiseError(
                "TALKIES_WYOMING_ZEROCONF needs the zeroconf package: "
                "pip install 'talkies[wyoming]'"
            ) from None
        self.address = advertised_address(host)
        packed = ipaddress.ip_address(self.address).packed
        self.port = port
        self._info: Any = self._zc.ServiceInfo(
            SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", addresses=[packed], port=port
        )
        self._zeroconf: Any = None

    @property
    def name(self) -> str:
        """The service's full name (it may have been renamed if the name was taken)."""
        return str(self._info.name)

    def register(self) -> None:
        """Announce the service (blocking: it probes the name first). A name another host
        on the network holds is changed (``talkies (2)``) rather than refused."""
        zeroconf = self._zc.Zeroconf()
        try:
            zeroconf.register_service(self._info, allow_name_change=True)
        except BaseException:
            zeroconf.close()
            raise
        self._zeroconf = zeroconf

    def unregister(self) -> None:
        """Say goodbye (listeners drop the service at once) and stop (blocking, brief)."""
        zeroconf, self._zeroconf = self._zeroconf, None
        if zeroconf is None:
            return
        try:
            with contextlib.suppress(Exception):  # goodbye is a courtesy; closing is not
                zeroconf.unregister_service(self._info)
        finally:
            zeroconf.close()
