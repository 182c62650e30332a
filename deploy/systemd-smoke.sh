#!/bin/bash
# Runs the units in systemd/ under a real systemd, on a machine (or VM) whose PID 1 is not
# systemd: a throw-away systemd boots in private pid/mount/cgroup namespaces, with the units
# installed in its /run/systemd/system, and the checks below talk to it with nsenter.
# Nothing on the host changes (users, units and /opt exist only in the private mount
# namespace, /proc/sys is read-only there, the hostname is private); the network namespace is shared, so the frontends use ports 18001 and 18002.
#
#   sudo deploy/systemd-smoke.sh        # needs root, unshare, nsenter, curl, a built .venv
#
# Test-only deviations, in a drop-in: no sysinit.target (DefaultDependencies=no), logs to
# files, WatchdogSec=4, and ProtectHome=tmpfs plus a read-only bind of the Python the venv
# was made from when that lives under /root or /home (pyenv); the units' other settings,
# hardening included, are used as shipped.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=$REPO/.venv
PORTS=(18001 18002)

teardown() {
    if [ -n "${UNSHARE_PID:-}" ]; then
        { kill -KILL "$UNSHARE_PID" && wait "$UNSHARE_PID"; } 2>/dev/null || true
    fi
    rm -rf "$WORK"
}

inside() {  # the namespace's PID 1-to-be: set up the private view, then exec systemd
    mount --make-rprivate /
    mount -t proc proc /proc
    # systemd as PID 1 raises a few kernel-wide sysctls at boot (fs.file-max,
    # net.unix.max_dgram_qlen): a read-only /proc/sys, as in a container, keeps the host's.
    mount --bind /proc/sys /proc/sys
    mount -o remount,bind,ro /proc/sys
    mount -t tmpfs tmpfs /run
    mount -t tmpfs tmpfs /opt
    mkdir -p /opt/tinyserve/venv /run/tslog /run/systemd/system
    mount --bind "$VENV" /opt/tinyserve/venv
    cp /etc/passwd /run/passwd && echo 'tinyserve:x:990:990::/opt/tinyserve:/usr/sbin/nologin' >>/run/passwd
    cp /etc/group /run/group && echo 'tinyserve:x:990:' >>/run/group
    mount --bind /run/passwd /etc/passwd && mount --bind /run/group /etc/group
    local s=/run/systemd/system base home=""
    cp "$REPO"/systemd/tinyserve-engine.service "$REPO"/systemd/tinyserve-frontend@.service \
        "$REPO"/systemd/tinyserve.target $s/
    mkdir -p $s/tinyserve.target.wants $s/tinyserve.target.d \
        $s/tinyserve-engine.service.d $s/tinyserve-frontend@.service.d
    ln -s ../tinyserve-engine.service $s/tinyserve.target.wants/
    for port in "${PORTS[@]}"; do
        ln -s ../tinyserve-frontend@.service "$s/tinyserve.target.wants/tinyserve-frontend@$port.service"
    done
    base=$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)')
    case $base in /root/* | /home/*) home="ProtectHome=tmpfs\nBindReadOnlyPaths=$base\n" ;; esac
    printf '[Unit]\nDefaultDependencies=no\n' >$s/tinyserve.target.d/smoke.conf
    printf "[Unit]\nDefaultDependencies=no\n[Service]\nStandardOutput=append:/run/tslog/%%N.log\nStandardError=inherit\nWatchdogSec=4\nEnvironment=TINYSERVE_THREADS=1 TINYSERVE_DRAIN_TIMEOUT=5\n$home" \
        >$s/tinyserve-engine.service.d/smoke.conf
    printf "[Unit]\nDefaultDependencies=no\n[Service]\nStandardOutput=append:/run/tslog/%%N.log\nStandardError=inherit\nWatchdogSec=4\nEnvironment=TINYSERVE_DRAIN_TIMEOUT=15\n$home" \
        >$s/tinyserve-frontend@.service.d/smoke.conf
    exec env container=tinyserve-smoke /lib/systemd/systemd --system --unit=tinyserve.target \
        --log-target=console --show-status=no
}

if [ "${1:-}" = --inside ]; then inside; fi

WORK=$(mktemp -d)
trap 'teardown' EXIT

[ "$(id -u)" = 0 ] || { echo "needs root (namespaces, mounts)" >&2; exit 2; }
for tool in unshare nsenter curl /lib/systemd/systemd; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done

unshare --pid --mount --cgroup --uts --kill-child "$0" --inside >"$WORK/systemd.log" 2>&1 &
UNSHARE_PID=$!
for _ in $(seq 100); do
    PID1=$(pgrep -P "$UNSHARE_PID" || true)
    [ -n "$PID1" ] && break
    sleep 0.1
done
S=(nsenter -t "$PID1" -m -p)
fail() { echo "FAIL: $*" >&2; "${S[@]}" sh -c 'tail -n 20 /run/tslog/*.log' >&2 || true; exit 1; }
state() { "${S[@]}" systemctl show -p "$2" --value "$1"; }
wait_ready() {  # every frontend answers /ready 200 within $1 s
    local deadline=$((SECONDS + $1))
    for port in "${PORTS[@]}"; do
        until [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/ready")" = 200 ]; do
            [ $SECONDS -lt $deadline ] || fail "frontend $port not ready"
            sleep 0.2
        done
    done
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

wait_ready 240
echo "ok: units active, frontends ready (Type=notify, ordering)"
[ "$(state tinyserve-engine StatusText)" != "" ] || fail "no STATUS= from the engine"
mode=$("${S[@]}" stat -c '%a %U' /run/tinyserve)
[ "$mode" = "700 tinyserve" ] || fail "runtime dir is '$mode'"
echo "ok: /run/tinyserve is $mode"

body='{"prompt": "1, 2, 3,", "max_tokens": 400, "stream": true}'
curl -sN "localhost:${PORTS[0]}/generate" -H 'Content-Type: application/json' -d "$body" >"$WORK/stream" &
sleep 1.5
killed=$(now)
"${S[@]}" kill -KILL "$(state tinyserve-engine MainPID)"
wait "$!"
grep -q '"finish_reason": "error"' "$WORK/stream" || fail "stream did not end with an error event"
echo "ok: engine kill -9 -> in-flight stream got its error event within $(since "$killed") s"
wait_ready 30
echo "ok: engine restarted (NRestarts=$(state tinyserve-engine NRestarts)), frontends serving $(since "$killed") s after the kill"

stopped=$(now)
"${S[@]}" kill -STOP "$(state tinyserve-engine MainPID)"
restarts=$(state tinyserve-engine NRestarts)
until [ "$(state tinyserve-engine NRestarts)" -gt "$restarts" ]; do
    awk -v t="$(since "$stopped")" 'BEGIN { exit !(t < 20) }' || fail "hung engine not restarted"
    sleep 0.2
done
wait_ready 30
echo "ok: hung engine (SIGSTOP) killed by the watchdog and restarted, serving $(since "$stopped") s later"

# Long enough to be in flight through the checks below (a 40-token one could end first: the
# frontend then exits at once and /ready finds its port closed), short enough to end well
# within the drain timeout of the drop-in.
curl -sN "localhost:${PORTS[1]}/generate" -H 'Content-Type: application/json' \
    -d '{"prompt": "1, 2, 3,", "max_tokens": 120, "stream": true}' >"$WORK/drain" &
client=$!
sleep 0.5
"${S[@]}" systemctl restart "tinyserve-frontend@${PORTS[1]}" &
restart=$!
sleep 0.2
ready=$(curl -s -o /dev/null -w '%{http_code}' "localhost:${PORTS[1]}/ready" || true)
[ "$ready" = 503 ] || fail "/ready said '$ready' while the frontend drained, not 503"
wait "$client" "$restart"
grep -q '"finish_reason": "length"' "$WORK/drain" || fail "in-flight stream lost on restart"
[ "$(state "tinyserve-frontend@${PORTS[1]}" ActiveState)" = active ] || fail "frontend not back"
echo "ok: systemctl restart of a frontend: /ready $ready while draining, in-flight stream finished"

"${S[@]}" kill -KILL "$(state "tinyserve-frontend@${PORTS[0]}" MainPID)"
sleep 0.5
wait_ready 30
echo "ok: frontend kill -9 -> restarted (NRestarts=$(state "tinyserve-frontend@${PORTS[0]}" NRestarts))"

stopped=$(now)
"${S[@]}" kill -STOP "$(state "tinyserve-frontend@${PORTS[0]}" MainPID)"
restarts=$(state "tinyserve-frontend@${PORTS[0]}" NRestarts)
until [ "$(state "tinyserve-frontend@${PORTS[0]}" NRestarts)" -gt "$restarts" ]; do
    awk -v t="$(since "$stopped")" 'BEGIN { exit !(t < 20) }' || fail "hung frontend not restarted"
    sleep 0.2
done
wait_ready 30
echo "ok: hung frontend (SIGSTOP) killed by the watchdog and restarted, serving $(since "$stopped") s later"

"${S[@]}" systemctl stop tinyserve.target
for unit in tinyserve-engine "tinyserve-frontend@${PORTS[0]}" "tinyserve-frontend@${PORTS[1]}"; do
    for _ in $(seq 100); do [ "$(state "$unit" ActiveState)" = inactive ] && break; sleep 0.1; done
    [ "$(state "$unit" ActiveState) $(state "$unit" Result)" = "inactive success" ] ||
        fail "$unit did not stop cleanly"
done
echo "ok: systemctl stop tinyserve.target: every unit inactive, result success"
