#!/usr/bin/env bash
# deploy_container.sh - deploy/Containerfile without a container engine (issue 16, docs/deploy.md):
# 1. a real linter: dockerfile-utils (the Dockerfile validator of the VS Code Docker tooling,
#    pinned in tests/clients/package-lock.json) reports nothing on the file, and reports a planted
#    unknown instruction and a bad HEALTHCHECK duration in a copy (the linter is shown to catch);
# 2. the runtime stage installs a package for every shared library the built binary needs
#    (readelf NEEDED -> the Debian package holding it here), so a new link dependency that the
#    Containerfile misses fails here rather than in a deployment;
# 3. the shape issue 16 asks for: multi-stage, a non-root USER, HEALTHCHECK on /health at the
#    EXPOSEd port that CMD passes as --port, STOPSIGNAL SIGTERM, the model as a VOLUME.
# The real build and run is tests/e2e/deploy_container_build.sh (skipped without a docker daemon).
set -eu
. "$(dirname "$0")/serve_lib.bash"
CF="$DRAMA_SRC/deploy/Containerfile"
[ -f "$CF" ] || fail "no $CF"
install_clients
LINT="$CLIENTS/node_modules/.bin/dockerfile-utils"
[ -x "$LINT" ] || fail "dockerfile-utils not installed in $CLIENTS"

rc=0; "$LINT" lint "$CF" >"$WORK/lint.out" 2>&1 || rc=$?
[ $rc = 0 ] && [ ! -s "$WORK/lint.out" ] || fail "dockerfile-utils lint (status $rc): $(cat "$WORK/lint.out")"
{ cat "$CF"; printf 'HEALTHCHECK --interval=10 CMD ["true"]\nRUNN true\n'; } >"$WORK/planted.Containerfile"
rc=0; "$LINT" lint "$WORK/planted.Containerfile" >"$WORK/lint.out" 2>&1 || rc=$?
[ $rc != 0 ] || fail "control: the linter passed a planted error: $(cat "$WORK/lint.out")"
grep -q "Unknown instruction: RUNN" "$WORK/lint.out" || fail "control: the unknown instruction was not reported: $(cat "$WORK/lint.out")"
grep -qi "duration" "$WORK/lint.out" || fail "control: the bad HEALTHCHECK duration was not reported: $(cat "$WORK/lint.out")"
ok "dockerfile-utils lint: clean; a planted unknown instruction and a bad duration are reported"

# the runtime stage: everything after the last FROM, continuation lines joined
awk '/^FROM /{buf=""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$CF" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' >"$WORK/runtime"
grep -q '^FROM .* AS runtime' "$WORK/runtime" || fail "the last stage is not 'AS runtime'"
[ "$(grep -c '^FROM ' "$CF")" -ge 2 ] || fail "not a multi-stage build"
pkgs=$(grep '^RUN apt-get' "$WORK/runtime" | sed 's/.*--no-install-recommends//; s/&&.*//')
[ -n "$pkgs" ] || fail "the runtime stage installs no packages"
needed=$(readelf -d "$DRAMA_BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ "$(echo "$needed" | grep -c .)" -ge 5 ] || fail "readelf found only: $needed"
missing=""
for lib in $needed; do
    # glibc is in every base image; libstdc++/libgcc_s too (apt depends on them; a CUDA-enabled
    # build links them); the sanitizer runtimes only in `make test-asan`'s build
    case $lib in libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | lib[alt]san.so.* | libubsan.so.*) continue ;; esac
    case $lib in libstdc++.so.* | libgcc_s.so.*) continue ;; esac
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64|x86_64|AArch64|aarch64/ {print $NF; exit}')
    [ -n "$path" ] || fail "$lib: not in ldconfig's cache"
    # by file name: with a merged /usr, dpkg may know the file under /lib or /usr/lib
    pkg=$(dpkg -S "*/$(basename "$(readlink -f "$path")")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || fail "$lib ($path): no Debian package owns it"
    echo " $pkgs " | grep -q " $pkg " || missing="$missing $lib($pkg)"
done
[ -z "$missing" ] || fail "the runtime stage lacks packages for:$missing"
ok "runtime stage installs the package of every NEEDED library: $(echo $needed | tr '\n' ' ')"

user=$(grep '^USER ' "$WORK/runtime" | tail -1 | awk '{print $2}')
case "$user" in "" | root | 0 | 0:*) fail "the runtime stage runs as '${user:-root}'" ;; esac
grep -q "useradd .*$user\|useradd .* $user\$" "$WORK/runtime" || fail "USER $user is not created in the runtime stage"
grep -qx 'STOPSIGNAL SIGTERM' "$WORK/runtime" || fail "no STOPSIGNAL SIGTERM"
expose=$(sed -n 's/^EXPOSE \([0-9]*\).*/\1/p' "$WORK/runtime")
[ -n "$expose" ] || fail "no EXPOSE"
grep '^CMD ' "$WORK/runtime" | grep -q "\"--port\", \"$expose\"" || fail "CMD does not pass --port $expose (the EXPOSEd port)"
grep '^HEALTHCHECK ' "$WORK/runtime" | grep -q "http://127.0.0.1:$expose/health\"" || fail "HEALTHCHECK does not probe /health on port $expose"
grep '^VOLUME ' "$WORK/runtime" | grep -q '"/model"' || fail "the model is not a VOLUME"
grep '^CMD ' "$WORK/runtime" | grep -q '"--model", "/model"' || fail "CMD does not load the model from /model"
grep -q '^COPY --from=build ' "$WORK/runtime" || fail "the runtime stage does not take the binary from the build stage"
grep -q 'build-essential\|gcc\|cmake\|-dev\b' "$WORK/runtime" && fail "the runtime stage installs build tools: $(grep -o 'build-essential\|cmake\|[a-z0-9-]*-dev\b' "$WORK/runtime" | head -3)"
ok "multi-stage, USER $user, HEALTHCHECK /health on $expose = EXPOSE = --port, STOPSIGNAL SIGTERM, VOLUME /model, no build tools at run time"
echo "deploy_container: all passed"
