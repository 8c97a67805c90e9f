#!/usr/bin/env bash
# deploy_systemd_boot.sh - deploy/drama@.service under a real systemd (issue 16, docs/deploy.md):
# a Debian 12 root made with mmdebstrap (systemd, curl and the runtime libraries of
# deploy/Containerfile) is booted with systemd-nspawn (--private-network: only its own loopback),
# the unit, the example env files (the tiny model as DRAMA_MODEL) and the built binary installed
# as docs/deploy.md says, and a oneshot unit inside checks: `systemctl start drama@0`, /health 200,
# a synthesis of exact size, a voice written to the StateDirectory, the sandbox as the kernel
# reports it (uid of the drama user, no capabilities, NoNewPrivs, a seccomp filter, the weights
# memory-mapped), then `systemctl stop` during a streamed request: the request completes, the
# unit's Result is success with exit status 0 and no restart.
# Opt-in (DRAMA_TEST_SYSTEMD_BOOT=1): it needs root, systemd-nspawn (Debian systemd-container),
# mmdebstrap and Debian's mirror, and takes minutes. Without them it is SKIPPED (exit 77).
set -eu
. "$(dirname "$0")/serve_lib.bash"
skip() { echo "SKIP: $*"; exit 77; }
[ "${DRAMA_TEST_SYSTEMD_BOOT:-0}" = 1 ] || skip "opt-in: DRAMA_TEST_SYSTEMD_BOOT=1 (root, systemd-nspawn, mmdebstrap, Debian mirror)"
[ "$(id -u)" = 0 ] || skip "needs root"
command -v systemd-nspawn >/dev/null || skip "no systemd-nspawn (Debian systemd-container)"
command -v mmdebstrap >/dev/null || skip "no mmdebstrap"
readelf -d "$DRAMA_BIN" | grep -q 'NEEDED.*libasan' && skip "sanitizer build: the boot test runs with the release build"
R="$WORK/rootfs"
# the runtime packages of the Containerfile's runtime stage, plus systemd
pkgs=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$DRAMA_SRC/deploy/Containerfile" | awk '/^FROM .* AS runtime/ {r = 1} r && /^RUN apt-get/ {print; exit}' |
    sed 's/.*--no-install-recommends//; s/&&.*//' | xargs | tr ' ' ',')
[ -n "$pkgs" ] || fail "no runtime packages found in deploy/Containerfile"
timeout 900 mmdebstrap --variant=minbase --mode=root --include="systemd,systemd-sysv,dbus,$pkgs" bookworm "$R" \
    "deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" >"$WORK/mmdebstrap.log" 2>&1 ||
    skip "mmdebstrap could not make the root (mirror unreachable?): $(tail -2 "$WORK/mmdebstrap.log")"
ok "Debian 12 root with systemd and the runtime packages"

# install as docs/deploy.md says
cp "$DRAMA_BIN" "$R/usr/local/bin/drama"
mkdir -p "$R/opt/drama/models/tiny" "$R/etc/drama"
cp "$MODEL"/* "$R/opt/drama/models/tiny/"
chmod -R a+rX "$R/opt/drama"
cp "$DRAMA_SRC/deploy/drama@.service" "$R/etc/systemd/system/"
sed 's#^DRAMA_MODEL=.*#DRAMA_MODEL=/opt/drama/models/tiny#' "$DRAMA_SRC/deploy/drama.env" >"$R/etc/drama/drama.env"
cp "$DRAMA_SRC/deploy/drama@0.env" "$R/etc/drama/"
chroot "$R" useradd --system --home-dir /var/lib/drama --shell /usr/sbin/nologin drama
port=$(sed -n 's/^DRAMA_PORT=//p' "$DRAMA_SRC/deploy/drama@0.env")
make_wav "$R/root/clip.wav" 0.5
FR=300
cat >"$R/usr/local/bin/unit-check.sh" <<EOF
#!/bin/sh
# runs inside the booted root; every line of /var/log/unit-check.log is read by the host
exec >/var/log/unit-check.log 2>&1
B=http://127.0.0.1:$port
systemctl start drama@0 && echo "start ok"
c=0
for i in \$(seq 1 300); do c=\$(curl -s -o /dev/null -w '%{http_code}' \$B/health); [ "\$c" = 200 ] && break; sleep 0.2; done
echo "health \$c"
curl -s -D /tmp/t.h -o /tmp/t.wav -H 'Content-Type: application/json' \\
    --data-binary '{"text": "Under systemd.", "frames": 5, "seed": 3, "format": "wav"}' \$B/v1/tts
echo "tts \$(head -1 /tmp/t.h | tr -d '\r') bytes \$(stat -c %s /tmp/t.wav)"
echo "served-by \$(grep -i '^x-served-by:' /tmp/t.h | cut -d' ' -f2 | tr -d '\r') host \$(cut -d. -f1 /proc/sys/kernel/hostname)"
printf '{"id": "unitvoice", "text": "A clip.", "audio": "%s"}' "\$(base64 -w0 /root/clip.wav)" >/tmp/v.json
echo "voice \$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @/tmp/v.json \$B/v1/voices)"
[ -f /var/lib/drama/voices/unitvoice/meta.json ] && echo "voice stored \$(stat -c %U /var/lib/drama/voices/unitvoice/meta.json)"
PID=\$(systemctl show -p MainPID --value drama@0)
echo "uid \$(awk '\$1 == "Uid:" {print \$2}' /proc/\$PID/status) drama \$(id -u drama)"
awk '\$1 == "CapEff:" || \$1 == "NoNewPrivs:" || \$1 == "Seccomp:" {print \$1, \$2}' /proc/\$PID/status
echo "mapped \$(grep -c '/opt/drama/models/tiny/.*\.safetensors' /proc/\$PID/maps)"
# stop with a streamed request running: the drain lets it finish
curl -s -o /tmp/long.pcm -w '%{http_code}' -H 'Content-Type: application/json' \\
    --data-binary '{"text": "A long one.", "frames": $FR, "seed": 4, "format": "pcm", "streaming": true}' \$B/v1/tts >/tmp/long.code &
L=\$!
for i in \$(seq 1 100); do [ -s /tmp/long.pcm ] && break; sleep 0.05; done
systemctl stop drama@0 && echo "stop ok"
wait \$L; echo "long rc \$? code \$(cat /tmp/long.code) bytes \$(stat -c %s /tmp/long.pcm)"
systemctl show drama@0 -p Result -p ExecMainStatus -p NRestarts -p ActiveState
journalctl -u drama@0 --no-pager -o cat | grep -c 'SIGTERM: draining' | sed 's/^/drain lines /'
echo DONE
systemctl poweroff
EOF
chmod +x "$R/usr/local/bin/unit-check.sh"
printf '[Unit]\nDescription=check drama@0\nAfter=multi-user.target\n[Service]\nType=oneshot\nExecStart=/usr/local/bin/unit-check.sh\n' \
    >"$R/etc/systemd/system/unit-check.service"
ln -s /etc/systemd/system/unit-check.service "$R/etc/systemd/system/multi-user.target.wants/unit-check.service"

timeout 300 systemd-nspawn -q -b --register=no --keep-unit --private-network -D "$R" >"$WORK/boot.log" 2>&1 </dev/null || true
L="$R/var/log/unit-check.log"
[ -f "$L" ] || fail "the check unit did not run: $(tail -20 "$WORK/boot.log")"
grep -q '^DONE$' "$L" || fail "the check did not finish: $(cat "$L")"
want() { grep -qx "$1" "$L" || fail "under systemd: want '$1' in: $(cat "$L")"; }
want "start ok"
want "health 200"
want "tts HTTP/1.1 200 OK bytes $((44 + 2 * 5 * SPF))"
sb=$(awk '$1 == "served-by" {print $2, $4}' "$L")
[ -n "${sb% *}" ] && [ "${sb% *}" = "${sb#* }-gpu0" ] || fail "X-Served-By and hostname under systemd: '$sb' (want %l-gpu0)"
want "voice 201"
want "voice stored drama"
uid=$(awk '$1 == "uid" {print $2}' "$L"); duid=$(awk '$1 == "uid" {print $4}' "$L")
[ -n "$uid" ] && [ "$uid" = "$duid" ] && [ "$uid" != 0 ] || fail "the replica runs as uid '$uid' (drama is '$duid')"
want "CapEff: 0000000000000000"
want "NoNewPrivs: 1"
want "Seccomp: 2"
[ "$(awk '$1 == "mapped" {print $2}' "$L")" -ge 1 ] || fail "the weights are not memory-mapped: $(grep mapped "$L")"
want "stop ok"
want "long rc 0 code 200 bytes $((2 * FR * SPF))"
want "Result=success"
want "ExecMainStatus=0"
want "NRestarts=0"
want "ActiveState=inactive"
want "drain lines 1"
ok "under systemd (nspawn boot): started, healthy, synthesis and voice, uid $uid, no capabilities, NoNewPrivs, seccomp, weights mapped; stop drained a running ${FR}-frame stream to completion, Result=success, exit 0"
echo "deploy_systemd_boot: all passed"
