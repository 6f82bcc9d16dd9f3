"""docker/: the Dockerfiles lint clean, the scripts pass shellcheck, the Compose file is valid,
and docker/smoke.sh builds the CPU image as it is and exercises it for real (real speech
through the spec's client and the HTTP route, SIGTERM with a stream open).

The smoke run needs a Docker engine: a running one, or dockerd that the script can start
(root, Debian's docker.io). Without one it is skipped, saying why; nothing else skips it. Its
first run on a machine makes the base images (a few minutes); later runs reuse them and the
build's layers (seconds, plus the streaming).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from talkies.config import Settings
from talkies.transport.server import ServerOptions

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILES = ("Dockerfile", "Dockerfile.cuda", "python-standin.Dockerfile")
SMOKE_TIMEOUT = 1800  # a first run builds everything; repeated runs take about a minute


def _tool(name: str) -> str:
    """A tool from the dev extra (in this interpreter's bin folder) or from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (the dev extra)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_has_nothing_to_say(dockerfile: str) -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "style", str(DOCKER / dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_shell_scripts_pass_shellcheck() -> None:
    result = subprocess.run(
        [_tool("shellcheck"), str(DOCKER / "entrypoint.sh"), str(DOCKER / "smoke.sh")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_images_share_the_runtime_contract() -> None:
    """What the entrypoint, the health check, Compose and Kubernetes rely on, in both images."""
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / name).read_text()
        for line in (
            'ENTRYPOINT ["/usr/local/bin/talkies-entrypoint"]',
            'CMD ["serve"]',
            'VOLUME ["/data"]',
            "TALKIES_DATA_DIR=/data",
            "TALKIES_HOST=0.0.0.0",
            "STOPSIGNAL SIGTERM",
            'CMD ["python", "/opt/talkies/healthcheck.py"]',
            "talkies models pull whisper-base-en",
            "ARG HUB_MODELS=",
        ):
            assert line in text, f"{name}: {line}"
        assert re.search(r"^USER [1-9]\d*:[1-9]\d*$", text, flags=re.M), f"{name}: not root"
        # RUN steps see build arguments as environment variables, and `talkies` refuses an
        # unknown TALKIES_* variable: `talkies models pull` would fail on one.
        assert not re.findall(r"^ARG TALKIES_", text, flags=re.M), name
        assert "# syntax=" not in text


def test_container_scripts_read_no_unknown_talkies_variables() -> None:
    """The server refuses to start with an unknown TALKIES_* variable in its environment, and
    the entrypoint's and health check's switches live in that same environment."""
    known = set(re.findall(r'"(TALKIES_[A-Z0-9_]+)"', (ROOT / "talkies" / "config.py").read_text()))
    assert "TALKIES_ENABLED_MODELS" in known
    read = set(re.findall(r"\$\{(\w+):-", (DOCKER / "entrypoint.sh").read_text()))
    read |= set(re.findall(r'environ\.get\("(\w+)"', (DOCKER / "healthcheck.py").read_text()))
    assert {"PREPULL_MODELS", "HEALTHCHECK_URL"} <= read
    assert {v for v in read if v.startswith("TALKIES_")} <= known


def test_compose_file(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {s["build"]["dockerfile"] for s in services.values()} == {
        "docker/Dockerfile",
        "docker/Dockerfile.cuda",
    }
    assert sorted(p for s in services.values() for p in s["profiles"]) == ["cpu", "cuda"]
    # Compose's default stop timeout (10 s) would SIGKILL streams still in their grace period.
    needed = 10 + ServerOptions().close_timeout + 1  # `talkies serve --grace` default 10 s
    for service in services.values():
        env = service["environment"]
        Settings.from_env(env)  # the server would start with these
        assert env["TALKIES_MODEL_MAX_CONCURRENCY"] == env["TALKIES_STREAM_MAX_CONNECTIONS"]
        assert int(service["stop_grace_period"].rstrip("s")) >= needed
        assert "talkies-data:/data" in service["volumes"]
    gpu = services["talkies-cuda"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["driver"] == "nvidia"
    compose_cli = shutil.which("docker-compose")
    if compose_cli is None:
        return  # the structure above is all that can be checked without Compose
    for profile in ("cpu", "cuda"):
        result = subprocess.run(
            [compose_cli, "-f", str(DOCKER / "compose.yaml"), "--profile", profile, "config"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr


def test_smoke_build_run_stream_transcribe_and_stop() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    try:
        result = subprocess.run(
            ["bash", str(DOCKER / "smoke.sh")],
            capture_output=True,
            text=True,
            env=env,
            timeout=SMOKE_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        pytest.fail(f"docker/smoke.sh took over {SMOKE_TIMEOUT} s:\n{out[-4000:]}")
    output = result.stdout + result.stderr
    if result.returncode == 77:
        reason = next((ln for ln in output.splitlines() if "SKIP" in ln), output.strip())
        pytest.skip(reason)
    assert result.returncode == 0, output[-6000:]
    assert "smoke: PASSED" in result.stdout
    # The timings and the image size, in the test report (`pytest -rA` shows them).
    sys.stdout.write(result.stdout[result.stdout.index("smoke: PASSED") :])
