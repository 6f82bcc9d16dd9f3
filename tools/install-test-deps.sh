#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian/Ubuntu machine: the virtual environment
# with the project and its dev extra, and the Debian packages that provide real speech audio
# (pocketsphinx-testdata), synthetic speech (espeak-ng, sox) and ffmpeg, which converts audio
# as the spec and the quick start show it; curl for the curl tests, gcc to build the test-only
# stand-in NVIDIA driver that lets the parakeet.cpp runtime take its CPU path; chromium for the
# browser page's tests; docker.io and debootstrap for docker/smoke.sh (a Docker engine, and a
# base image made without a registry), docker-compose to validate docker/compose.yaml, nginx
# for the scale-out test.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in chromium curl debootstrap docker-compose docker.io espeak-ng ffmpeg gcc libc6-dev nginx \
    pocketsphinx-testdata sox; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev,bench]'
# Qwen3-TTS's package, without the gradio and CUDA torchaudio its metadata asks for (the qwen3
# extra above holds what it really needs; see pyproject.toml).
.venv/bin/python -m pip install -q --no-deps qwen-tts==0.1.1
