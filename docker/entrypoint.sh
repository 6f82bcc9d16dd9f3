#!/bin/sh
# Entrypoint of the Talkies images (docker/Dockerfile, docker/Dockerfile.cuda).
#
# `serve` (the default command), or `talkies serve` options alone (`--grace 20`):
#   1. link the models baked into the image (/opt/talkies/models/<slug>) into
#      $TALKIES_DATA_DIR/models, so a fresh volume or bind mount on /data starts with them;
#   2. with TALKIES_ENABLED_MODELS unset, enable exactly those baked-in models;
#   3. pre-pull TALKIES_ENABLED_MODELS at their pins (`talkies models pull`): baked-in ones
#      are already complete, others download now (once; they stay in the data volume), and a
#      model that cannot be had stops the container here with the reason, not at a client's
#      first stream (PREPULL_MODELS=0 skips this step);
#   4. exec `talkies serve`: the server replaces this shell as PID 1, so the SIGTERM of
#      `docker stop` or Kubernetes reaches it directly (new connections refused, streams get
#      the grace period, then close 1001; exit status 0).
# Any other command runs as given, after step 1: `docker run IMAGE talkies models list`.
# The entrypoint's own switch is not named TALKIES_*: the server refuses unknown TALKIES_*
# variables, and it inherits this environment.
set -eu

bundled=/opt/talkies/models
data=${TALKIES_DATA_DIR:-/data}

link_bundled() {
    mkdir -p "$data/models"
    for dir in "$bundled"/*/; do
        [ -d "$dir" ] || continue
        slug=$(basename "$dir")
        slugs="${slugs:+$slugs,}$slug"
        link="$data/models/$slug"
        # A link left by an older image whose model is gone would block a fresh download.
        if [ -L "$link" ] && [ ! -e "$link" ]; then
            rm -f "$link"
        fi
        if [ ! -e "$link" ]; then
            ln -s "$bundled/$slug" "$link"
        fi
    done
}

slugs=""
case "${1:-serve}" in
    serve) if [ "$#" -gt 0 ]; then shift; fi ;;
    -*) ;;
    *)
        # `talkies models list` and the like see the baked-in models too.
        link_bundled 2>/dev/null || true
        exec "$@"
        ;;
esac

link_bundled

if [ -z "${TALKIES_ENABLED_MODELS:-}" ] && [ -n "$slugs" ]; then
    TALKIES_ENABLED_MODELS=$slugs
    export TALKIES_ENABLED_MODELS
fi

if [ "${PREPULL_MODELS:-1}" != 0 ] && [ -n "${TALKIES_ENABLED_MODELS:-}" ]; then
    set -f  # slugs, not patterns
    # shellcheck disable=SC2046  # one argument per comma-separated slug
    if ! talkies models pull $(printf '%s' "$TALKIES_ENABLED_MODELS" | tr ',' ' '); then
        echo "talkies-entrypoint: could not pre-pull TALKIES_ENABLED_MODELS=$TALKIES_ENABLED_MODELS" \
            "(see above); fix it, or set PREPULL_MODELS=0 to start without them" >&2
        exit 1
    fi
    set +f
fi

exec talkies serve "$@"
