#!/usr/bin/env bash
# deploy_container_build.sh - deploy/Containerfile built and run for real (issue 16,
# docs/deploy.md). SKIPPED (exit 77, never a pass) when no docker daemon answers or the base image
# can neither be found locally nor pulled: CI machines need not have either.
# Builds the image from this tree, starts it with its default CMD (0.0.0.0:8080, keys from the
# mounted secret file) on the tiny model mounted read-only at /model, in a container without a
# network (--network none: every request below is sent from inside the container to its own
# 127.0.0.1), and checks: non-root uid, no compiler or cmake in the image, Docker's HEALTHCHECK
# reaches "healthy", /health 200, a synthesis with the key (exact size) and 401 without it, a voice
# written to the /voices volume, and `docker stop` (SIGTERM) drains and exits 0.
set -eu
. "$(dirname "$0")/serve_lib.bash"
skip() { echo "SKIP: $*"; exit 77; }
command -v docker >/dev/null || skip "no docker command"
# the image is built from the sources, not from DRAMA_BIN: once (the release build's run) is enough
readelf -d "$DRAMA_BIN" | grep -q 'NEEDED.*libasan' && skip "sanitizer build of drama: the image build runs with the release build"
docker info >/dev/null 2>&1 || skip "no docker daemon answers: $(docker info 2>&1 | grep -i "cannot connect\|error" | tail -1)"
CF="$DRAMA_SRC/deploy/Containerfile"
base=$(sed -n 's/^ARG BUILD_IMAGE=//p' "$CF")
[ -n "$base" ] || fail "no ARG BUILD_IMAGE default in $CF"
if ! docker image inspect "$base" >/dev/null 2>&1; then
    timeout 120 docker pull "$base" >"$WORK/pull.log" 2>&1 || skip "base image $base: not local and not pulled: $(tail -1 "$WORK/pull.log")"
fi
TAG="drama-e2e:$$"
NAME="drama-e2e-$$"
docker_cleanup() {
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then docker logs "$NAME" 2>&1 | tail -20 >&2 || true; fi
    docker rm -f "$NAME" >/dev/null 2>&1 || true
    docker rmi -f "$TAG" >/dev/null 2>&1 || true
    (exit $rc)
    cleanup
}
trap docker_cleanup EXIT

# a daemon without its default bridge (dockerd --bridge=none) builds on the host's network
net=()
docker network inspect bridge >/dev/null 2>&1 || net=(--network host)
t0=$(date +%s)
timeout 1500 docker build "${net[@]}" -f "$CF" -t "$TAG" "$DRAMA_SRC" >"$WORK/build.log" 2>&1 ||
    fail "docker build: $(tail -20 "$WORK/build.log")"
ok "docker build in $(($(date +%s) - t0)) s: $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1 / 1e6}')"

uid=$(docker run --rm --network none --entrypoint id "$TAG" -u)
[ "$uid" != 0 ] && [ -n "$uid" ] || fail "the image runs as uid '$uid'"
tools=$(docker run --rm --network none --entrypoint sh "$TAG" -c 'for t in cc gcc cmake make; do command -v $t; done; true')
[ -z "$tools" ] || fail "build tools in the runtime image: $tools"

KEY="e2e-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$KEY" >"$WORK/keys"
chmod 644 "$WORK/keys"
docker run -d --network none --name "$NAME" -v "$MODEL:/model:ro" \
    -v "$WORK/keys:/run/secrets/drama-api-keys:ro" "$TAG" >/dev/null || fail "docker run"
inside() { docker exec -i "$NAME" "$@"; }
health=""
for i in $(seq 1 240); do
    health=$(docker inspect -f '{{.State.Health.Status}}' "$NAME" 2>/dev/null || true)
    [ "$health" = healthy ] && break
    [ "$(docker inspect -f '{{.State.Running}}' "$NAME")" = true ] || fail "the container exited: $(docker logs "$NAME" 2>&1 | tail -5)"
    sleep 0.5
done
[ "$health" = healthy ] || fail "HEALTHCHECK never healthy (last: $health): $(docker inspect -f '{{json .State.Health}}' "$NAME" | head -c 600)"
[ "$(inside id -u)" = "$uid" ] || fail "the server runs as uid $(inside id -u), not $uid"
s=$(inside curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health)
[ "$s" = 200 ] || fail "/health in the container: $s"
body='{"text": "From the container.", "frames": 5, "seed": 3, "format": "wav"}'
s=$(echo "$body" | inside curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @- http://127.0.0.1:8080/v1/tts)
[ "$s" = 401 ] || fail "/v1/tts without the key: $s (want 401)"
n=$(echo "$body" | inside sh -c "curl -sf -H 'Authorization: Bearer $KEY' -H 'Content-Type: application/json' --data-binary @- http://127.0.0.1:8080/v1/tts | wc -c")
[ "$n" = $((44 + 2 * 5 * SPF)) ] || fail "/v1/tts with the key: $n bytes, want $((44 + 2 * 5 * SPF))"
make_wav "$WORK/clip.wav" 0.5
printf '{"id": "boxed", "text": "A clip.", "audio": "%s"}' "$(base64 -w0 "$WORK/clip.wav")" |
    inside curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        --data-binary @- http://127.0.0.1:8080/v1/voices >"$WORK/voice.code"
[ "$(cat "$WORK/voice.code")" = 201 ] || fail "POST /v1/voices in the container: $(cat "$WORK/voice.code")"
inside test -f /voices/boxed/meta.json || fail "the voice is not in the /voices volume"
ok "container: uid $uid, healthy, /health 200, 401 without the key, $n bytes with it, voice in /voices"

docker stop -t 45 "$NAME" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "docker stop (STOPSIGNAL SIGTERM): exit code $code, want 0 (a drained stop)"
docker logs "$NAME" 2>&1 | grep -q "SIGTERM: draining" || fail "no drain in the log: $(docker logs "$NAME" 2>&1 | tail -3)"
ok "docker stop: SIGTERM, drained, exit 0"
echo "deploy_container_build: all passed"
