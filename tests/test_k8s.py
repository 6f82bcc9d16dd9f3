"""docker/k8s: valid Kubernetes objects, and consistent with the server and the images.

The schemas are those bundled with `kubernetes-validate` (offline), in strict mode (unknown
fields are errors), for the oldest and newest Kubernetes releases checked here. The rest ties
the manifests to the code: probe paths, the stop sequence against the server's grace period
and close timeout, the stream capacity against nginx's max_conns, the user against the
images' USER, and the environment against the server's own settings parser.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from talkies.cli import _parser
from talkies.config import Settings
from talkies.transport.server import ServerOptions

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra)"
)

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "docker" / "k8s"
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def _objects() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in _documents() if doc["kind"] != "Kustomization"]


def _one(kind: str) -> dict[str, Any]:
    [doc] = [doc for _, doc in _objects() if doc["kind"] == kind]
    return doc


def _container() -> dict[str, Any]:
    [container] = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container().get("env", []) if "value" in e}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_for_kubernetes(version: str) -> None:
    objects = _objects()
    assert {doc["kind"] for _, doc in objects} >= {"Deployment", "Service"}
    for name, doc in objects:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} ({doc['kind']}) is not valid for Kubernetes {version}: {exc}")


def test_the_checker_rejects_a_misspelt_field() -> None:
    broken = copy.deepcopy(_one("Deployment"))
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbes"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    [kustomization] = [doc for _, doc in _documents() if doc["kind"] == "Kustomization"]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_probes_readiness_on_readyz_liveness_on_healthz() -> None:
    container = _container()
    [port] = container["ports"]
    assert port["containerPort"] == 8000 and port["name"] == "http"  # TALKIES_PORT in images
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    # A full pod must leave the endpoints at its first 503, not three probes later.
    assert container["readinessProbe"]["failureThreshold"] == 1
    service = _one("Service")
    assert service["spec"]["selector"] == _one("Deployment")["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_termination_grace_covers_the_servers_own_shutdown() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _container()
    args = _parser().parse_args(container["args"])  # the entrypoint passes them to serve
    assert args.command == "serve"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # server.shutdown: grace for streams to end, then close 1001 and close_timeout + 1 s for
    # the clients' answers (talkies/transport/server.py).
    needed = float(pre_stop[1]) + args.grace + ServerOptions().close_timeout + 1
    granted = pod["terminationGracePeriodSeconds"]
    assert needed <= granted <= needed + 10, (needed, granted)


def test_environment_is_valid_and_capacity_matches_nginx() -> None:
    env = _env()
    Settings.from_env(env)  # raises ConfigError on anything the server would refuse
    streams = int(env["TALKIES_STREAM_MAX_CONNECTIONS"])
    # A stream needs a server slot and a model slot: both limits are the pod's capacity.
    assert int(env["TALKIES_MODEL_MAX_CONCURRENCY"]) == streams
    nginx = (ROOT / "docker" / "nginx.conf").read_text()
    assert set(re.findall(r"max_conns=(\d+)", nginx)) == {str(streams)}


def test_runs_as_the_images_user_on_a_read_only_root() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _container()
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (ROOT / "docker" / dockerfile).read_text()
        [user] = re.findall(r"^USER (\d+):(\d+)$", text, flags=re.M)
        assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
            int(user[0]),
            int(user[1]),
        )
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) == {"/data", "/tmp"}  # TALKIES_DATA_DIR, and temporary files
    assert all(name in volumes for name in mounts.values())
