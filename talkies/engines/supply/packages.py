"""Python packages a model needs: whether they are installed, and the Talkies extra that
installs them.

Looked up in the installed distributions' metadata (``importlib.metadata``), never by
importing them: a status listing must not load an engine's native library. The extras come
from Talkies' own metadata (the ``Requires-Dist`` lines ``pyproject.toml`` became), so the
hint a missing package gets cannot drift from what the extras install.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

__all__ = ["extra_providing", "install_hint", "is_installed", "missing"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
# Extras that gather the others: never the one to name.
_GATHERING = frozenset({"dev", "all"})


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed (looked up each time: a package installed while
    the server runs counts at once)."""
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing(distributions: Iterable[str]) -> list[str]:
    """The distributions of ``distributions`` that are not installed, in order, once each."""
    out: list[str] = []
    for name in distributions:
        if name not in out and not is_installed(name):
            out.append(name)
    return out


def _talkies() -> metadata.Distribution | None:
    """Talkies' installed metadata: the installation's own (it records where it was
    installed from), before a build's ``talkies.egg-info`` in a source tree on ``sys.path``;
    None when run from a source tree that was never installed."""
    found = list(metadata.distributions(name="talkies"))
    for dist in found:
        if dist.read_text("direct_url.json") is not None:
            return dist
    return found[0] if found else None


def extra_providing(distribution: str) -> str | None:
    """The Talkies extra that lists ``distribution`` itself (not through another extra), or
    None when no extra does (or Talkies' metadata is not installed)."""
    talkies = _talkies()
    wanted = _canonical(distribution)
    for line in (talkies.requires or []) if talkies is not None else []:
        requirement, _, marker = line.partition(";")
        name = _NAME.match(requirement.strip())
        extra = _EXTRA.search(marker)
        if name is None or extra is None or extra.group(1) in _GATHERING:
            continue
        if _canonical(name.group(0)) == wanted:
            return extra.group(1)
    return None


def _install_extras(extras: list[str]) -> str:
    """The pip command that adds ``extras`` to this installation of Talkies: to the folder it
    was installed from while that folder is still there (``-e`` for an editable install, as
    the README's), else the package by name."""
    spec = ",".join(extras)
    talkies = _talkies()
    origin = talkies.read_text("direct_url.json") if talkies is not None else None
    try:
        found = json.loads(origin) if origin else {}
    except ValueError:
        found = {}
    if not isinstance(found, dict):
        found = {}
    url = found.get("url")
    dir_info = found.get("dir_info")
    if isinstance(url, str) and url.startswith("file://") and isinstance(dir_info, dict):
        folder = Path(urllib.parse.unquote(url.removeprefix("file://")))
        if (folder / "pyproject.toml").is_file():
            editable = "-e " if dir_info.get("editable") else ""
            return f"pip install {editable}'{folder}[{spec}]'"
    return f"pip install 'talkies[{spec}]'"


def install_hint(distributions: Iterable[str]) -> str:
    """What installs ``distributions``: the Talkies extras that list them, and pip for any
    that no extra lists. One hint however many packages are missing."""
    extras: list[str] = []
    loose: list[str] = []
    for name in distributions:
        extra = extra_providing(name)
        if extra is None:
            loose.append(name)
        elif extra not in extras:
            extras.append(extra)
    parts = []
    if extras:
        which = " and ".join(repr(e) for e in extras)
        noun = "extra" if len(extras) == 1 else "extras"
        parts.append(f"the {which} {noun} of Talkies: {_install_extras(extras)}")
    if loose:
        parts.append("pip install " + " ".join(loose))
    return "; ".join(parts)
