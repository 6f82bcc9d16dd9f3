#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian/Ubuntu machine: the virtual environment
# with the project and its dev extra, and the Debian packages that provide real speech audio
# (pocketsphinx-testdata), synthetic speech (espeak-ng, sox) and ffmpeg, which converts audio
# as the spec and the quick start show it.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in espeak-ng ffmpeg pocketsphinx-testdata sox; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev]'
