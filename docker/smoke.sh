#!/usr/bin/env bash
# Build docker/Dockerfile as it is and exercise the image for real, on a machine that reaches
# no container registry:
#   1. a Docker engine: the running one, or dockerd started here (and stopped again at the end);
#   2. python:3.11-slim: the local image of that name when there is one; otherwise a stand-in
#      (docker/python-standin.Dockerfile) on a Debian bookworm root made with debootstrap from
#      the mirror the host's apt uses, trusting the host's extra CA certificates and using its
#      network package indexes, so HTTPS from inside builds works as it does on the host;
#   3. the CPU image, with no hub/url models (--build-arg HUB_MODELS=): the offline
#      default whisper-base-en is in it, as always;
#   4. run it (unprivileged, /data volume), wait for its HEALTHCHECK to say healthy;
#   5. stream a real English recording through it with the spec's example client (model
#      whisper-base-en) and check the words; POST it to /v1/audio/transcriptions, same check;
#   6. `docker stop` (SIGTERM) with a stream open: the stream gets the grace period then a 1001
#      close, and the container exits with status 0.
# Everything a run leaves (the base images, the build's layers) is reused by the next one, so
# a repeated run takes seconds where nothing changed. Prints the image size and each phase's
# time.
#
# Exit status: 0 passed; 77 no Docker engine can be had here (none running, and dockerd is
# missing or cannot be started, e.g. not root): tests/test_docker.py skips on it; else failed.
#
# Settings: PYTHON (a Python with `websockets`; default .venv/bin/python),
# SMOKE_IMAGE (default talkies:smoke), SMOKE_REBUILD_BASE=1 (make the
# stand-in again), SMOKE_KEEP_DOCKERD=1 (leave a dockerd started here running).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

IMAGE=${SMOKE_IMAGE:-talkies:smoke}
PYTHON_IMAGE=python:3.11-slim
ROOTFS_IMAGE=talkies-smoke/debian:bookworm
PY=${PYTHON:-$ROOT/.venv/bin/python}
STATE=${SMOKE_STATE:-/var/tmp/talkies-smoke}
RECORDING=/usr/share/pocketsphinx/test/data/goforward.raw
GRACE=3             # `talkies serve --grace` in the smoke run: how long a held stream may go on
HEALTH_TIMEOUT=120  # seconds for the container to become healthy
# The classic builder: it needs no buildx plugin and asks no registry for a Dockerfile
# frontend. Images present locally are used without pulling.
export DOCKER_BUILDKIT=0

WORK=$(mktemp -d /tmp/talkies-smoke.XXXXXX)
CONTAINER=""
HOLDER=""
DOCKERD=""
REPORT=()
STARTED_AT=$(date +%s.%N)

say() { printf '%s\n' "$*"; }
die() {
    say "smoke: FAILED: $*" >&2
    exit 1
}
skip() {
    say "smoke: SKIP: $*" >&2
    exit 77
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
PHASE=""
PHASE_AT=""
phase() {
    [[ -z $PHASE ]] || REPORT+=("$(printf '  %-44s %7s s' "$PHASE" "$(since "$PHASE_AT")")")
    PHASE=$1
    PHASE_AT=$(date +%s.%N)
    [[ -z $PHASE ]] || say "== $PHASE"
}

cleanup() {
    local status=$?
    if [[ -n $HOLDER ]]; then kill "$HOLDER" 2>/dev/null || true; fi
    if [[ -n $CONTAINER ]]; then
        if ((status != 0 && status != 77)); then
            say "-- container log (last 40 lines):" >&2
            docker logs --tail 40 "$CONTAINER" >&2 2>&1 || true
        fi
        docker rm -f -v "$CONTAINER" >/dev/null 2>&1 || true
    fi
    if [[ -n $DOCKERD && ${SMOKE_KEEP_DOCKERD:-0} != 1 ]]; then
        kill "$DOCKERD" 2>/dev/null || true
        wait "$DOCKERD" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# -- 1. the engine ---------------------------------------------------------------------------
ensure_engine() {
    command -v docker >/dev/null || skip "no Docker engine: the docker client is not installed (Debian: apt-get install docker.io)"
    if docker info >/dev/null 2>&1; then
        say "using the running Docker engine ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
        return
    fi
    command -v dockerd >/dev/null || skip "no Docker engine: none is running and dockerd is not installed (Debian: apt-get install docker.io)"
    [[ $(id -u) -eq 0 ]] || skip "no Docker engine: none is running, and starting dockerd needs root"
    mkdir -p "$STATE"
    dockerd >"$STATE/dockerd.log" 2>&1 </dev/null &
    DOCKERD=$!
    for _ in $(seq 1 120); do
        if docker info >/dev/null 2>&1; then
            say "started dockerd (pid $DOCKERD, log $STATE/dockerd.log)"
            return
        fi
        kill -0 "$DOCKERD" 2>/dev/null || break
        sleep 0.5
    done
    tail -n 20 "$STATE/dockerd.log" >&2 || true
    kill "$DOCKERD" 2>/dev/null || true
    DOCKERD=""
    skip "no Docker engine: dockerd could not be started here (its log above)"
}

# -- 2. python:3.11-slim ---------------------------------------------------------------------
apt_mirror() {
    # The Debian mirror the host's apt uses (deb822 or one-line sources), else Debian's own.
    local uri
    uri=$(awk '/^URIs:/ && !/security/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [[ -n $uri ]] || uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true)
    say "${uri:-http://deb.debian.org/debian}"
}

host_pip_conf() {
    # The host's network package indexes (pip's own view: files and PIP_* variables); the
    # ones on the host's disk (file://, find-links) cannot be reached from a build.
    "$PY" - <<'EOF'
import subprocess
import sys

listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
).stdout
found: dict[str, list[str]] = {}
for line in sorted(listing.splitlines(), key=lambda ln: not ln.startswith(":env:")):
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if name in ("index-url", "extra-index-url", "trusted-host") and name not in found:
        found[name] = value.strip().strip("'\"").split()
web = {k: [u for u in v if "://" not in u or u.startswith(("http://", "https://"))] for k, v in found.items()}
out = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt"]
if web.get("index-url"):
    out.append(f"index-url = {web['index-url'][0]}")
if web.get("extra-index-url"):
    out.append("extra-index-url = " + " ".join(web["extra-index-url"]))
if web.get("trusted-host"):
    out.append("trusted-host = " + " ".join(web["trusted-host"]))
sys.stdout.write("\n".join(out) + "\n")
EOF
}

slim_root() {
    # What makes Debian's official -slim images what they are: apt keeps no downloaded .deb
    # files or caches, dpkg installs no documentation, manual pages or translations.
    local root=$1
    cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/usr/share/groff/*
    find "$root/usr/share/doc" -type f ! -name copyright -delete
}

ensure_python_image() {
    if [[ ${SMOKE_REBUILD_BASE:-0} != 1 ]] && docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
        local label
        label=$(docker image inspect -f '{{index .Config.Labels "org.talkies.stand-in-for"}}' "$PYTHON_IMAGE" 2>/dev/null || true)
        say "reusing the local $PYTHON_IMAGE${label:+ (the stand-in made by an earlier run)}"
        return
    fi
    if [[ ${SMOKE_REBUILD_BASE:-0} == 1 ]] || ! docker image inspect "$ROOTFS_IMAGE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || die "no $PYTHON_IMAGE image and no debootstrap to make one (Debian: apt-get install debootstrap)"
        local mirror rootfs
        mirror=$(apt_mirror)
        rootfs=$(mktemp -d /var/tmp/talkies-rootfs.XXXXXX)
        say "debootstrap --variant=minbase bookworm from $mirror"
        if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1; then
            tail -n 20 "$WORK/debootstrap.log" >&2
            rm -rf "$rootfs"
            die "debootstrap failed"
        fi
        slim_root "$rootfs"
        tar -C "$rootfs" -c . | docker import --change 'CMD ["bash"]' - "$ROOTFS_IMAGE" >/dev/null
        rm -rf "$rootfs"
        say "imported $ROOTFS_IMAGE"
    fi
    local ctx=$WORK/standin
    mkdir -p "$ctx/ca" "$ctx/apt/apt.conf.d" "$ctx/apt/sources.list.d"
    shopt -s nullglob
    local certs=(/usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt)
    shopt -u nullglob
    ((${#certs[@]} == 0)) || cp "${certs[@]}" "$ctx/ca/"
    if grep -qs bookworm /etc/apt/sources.list.d/debian.sources; then
        cp /etc/apt/sources.list.d/debian.sources "$ctx/apt/sources.list.d/"
        echo "# see sources.list.d/debian.sources" >"$ctx/apt/sources.list"
    fi
    apt-config dump 2>/dev/null | grep -i '^Acquire::Check-Valid-Until' >"$ctx/apt/apt.conf.d/99talkies-smoke" || true
    host_pip_conf >"$ctx/pip.conf"
    say "building the stand-in $PYTHON_IMAGE (${#certs[@]} extra CA certificates; pip.conf: $(grep -c url "$ctx/pip.conf") index lines)"
    if ! docker build -f docker/python-standin.Dockerfile -t "$PYTHON_IMAGE" "$ctx" >"$WORK/standin.log" 2>&1; then
        tail -n 30 "$WORK/standin.log" >&2
        die "the stand-in $PYTHON_IMAGE could not be built"
    fi
}

# -- 3.-6. ----------------------------------------------------------------------------------
wait_healthy() {
    local status="" deadline=$((SECONDS + HEALTH_TIMEOUT))
    while ((SECONDS < deadline)); do
        status=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$CONTAINER")
        case $status in
            "running healthy") return ;;
            running*) sleep 0.5 ;;
            *) die "the container stopped before it was healthy ($status)" ;;
        esac
    done
    die "not healthy after ${HEALTH_TIMEOUT} s ($status)"
}

[[ -f $RECORDING ]] || die "$RECORDING is missing (Debian: apt-get install pocketsphinx-testdata)"
"$PY" -c "import websockets" 2>/dev/null || die "$PY has no websockets (pip install websockets)"

phase "docker engine"
ensure_engine

phase "base image ($PYTHON_IMAGE)"
ensure_python_image

phase "build $IMAGE (docker/Dockerfile, offline)"
mkdir -p "$STATE"
if ! docker build -f docker/Dockerfile --build-arg HUB_MODELS= --label org.talkies.smoke=1 \
    -t "$IMAGE" . >"$STATE/build.log" 2>&1; then
    tail -n 60 "$STATE/build.log" >&2
    die "docker build failed (whole log: $STATE/build.log)"
fi
grep -E '^(Step |Successfully)' "$STATE/build.log" | sed 's/^/  /' || true
docker image prune -f --filter label=org.talkies.smoke=1 >/dev/null 2>&1 || true
SIZE_MB=$(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f", $1 / 1e6 }')
say "image $IMAGE: $SIZE_MB MB"

phase "run until healthy"
CONTAINER=talkies-smoke-$$
docker run -d --name "$CONTAINER" -p 127.0.0.1::8000 --health-interval 1s \
    "$IMAGE" serve --grace "$GRACE" >/dev/null
PORT=$(docker port "$CONTAINER" 8000/tcp | head -n 1 | sed 's/.*://')
BASE=http://127.0.0.1:$PORT
wait_healthy
USER_ID=$(docker exec "$CONTAINER" id -u)
[[ $USER_ID != 0 ]] || die "the server runs as root"
READY=$(curl -fsS "$BASE/readyz") || die "/readyz did not answer 200"
say "healthy on $BASE as uid $USER_ID; /readyz: $READY"

phase "stream goforward.raw (spec client)"
"$PY" docker/smoke_check.py stream "$BASE" || die "the streamed words are wrong"

phase "POST /v1/audio/transcriptions"
"$PY" docker/smoke_check.py transcribe "$BASE" || die "the transcribed words are wrong"

phase "SIGTERM with a stream open"
"$PY" docker/smoke_check.py hold "$BASE" >"$WORK/hold.out" 2>&1 &
HOLDER=$!
for _ in $(seq 1 100); do
    grep -qs '^ready' "$WORK/hold.out" && break  # -s: the file may not be there yet
    kill -0 "$HOLDER" 2>/dev/null || break
    sleep 0.1
done
grep -q '^ready' "$WORK/hold.out" || die "the held stream did not start: $(cat "$WORK/hold.out")"
STOP_AT=$(date +%s.%N)
docker stop -t 30 "$CONTAINER" >/dev/null
STOP_TOOK=$(since "$STOP_AT")
HOLD_STATUS=0
wait "$HOLDER" || HOLD_STATUS=$?
HOLDER=""
EXIT_CODE=$(docker inspect -f '{{.State.ExitCode}}' "$CONTAINER")
say "stopped in $STOP_TOOK s (grace $GRACE s); held stream: $(tail -n 1 "$WORK/hold.out"); exit status $EXIT_CODE"
((HOLD_STATUS == 0)) || die "the held stream did not get a 1001 close: $(cat "$WORK/hold.out")"
[[ $EXIT_CODE == 0 ]] || die "the container exited with status $EXIT_CODE after SIGTERM"
# Not `docker logs | grep -q`: grep quits at its first match, docker logs then dies of SIGPIPE,
# and pipefail turns that into a failure.
LOGS=$(docker logs "$CONTAINER" 2>&1)
grep -q 'shutting down' <<<"$LOGS" || die "the server did not log its shutdown"

phase ""
say "smoke: PASSED: image $IMAGE $SIZE_MB MB; $(since "$STARTED_AT") s in all"
printf '%s\n' "${REPORT[@]}"
