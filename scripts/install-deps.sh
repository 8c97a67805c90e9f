#!/bin/sh
# Installs the Debian packages drama.c needs to build and test. Idempotent: only
# missing packages are installed, and apt is not touched when everything is present.
set -eu

PKGS="build-essential cmake pkg-config clang libclang-rt-14-dev valgrind \
libjansson-dev libmicrohttpd-dev libsndfile1-dev libsoxr-dev libpcre2-dev \
libutf8proc-dev libssl-dev libcurl4-openssl-dev libcmocka-dev libopenblas-dev zlib1g-dev curl jq \
libmsgpack-dev libmp3lame-dev libopusenc-dev wrk opus-tools mpg123 chromium tidy haproxy systemd"
# chromium, tidy: the playground's browser test and HTML check (tests/e2e/serve_ui*.sh).
# haproxy: the balancer of tests/e2e/scale_haproxy.sh and deploy/haproxy.cfg.
# systemd: systemd-analyze verify/security on deploy/drama@.service (tests/e2e/deploy_systemd.sh;
# offline, no running systemd needed).
# The server's client tests run Node (openai, @msgpack/msgpack, puppeteer-core); a Node already on PATH (with its
# own npm) is used as it is, else Debian's.
if ! command -v npm >/dev/null 2>&1; then PKGS="$PKGS nodejs npm"; fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
