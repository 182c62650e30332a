#!/bin/sh
# Debian packages that some tests use: nginx (a real balancer in front of real nodes),
# systemd, for systemd-analyze (unit checks), chromium (the dashboard's browser test) and
# prometheus, for promtool (the alerting rules' checks and unit tests).
# Installed only when missing, and only as root with apt-get (a fresh Debian machine, CI).
# Anywhere else this says what is missing and succeeds: the tests that need a missing
# command skip with a message that names it.
set -u

missing=""
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
have nginx || missing="$missing nginx"
have systemd-analyze || missing="$missing systemd"
have chromium || missing="$missing chromium"
have promtool || missing="$missing prometheus"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: not installed:$missing. Tests that need them will be skipped;" \
        "to run them: sudo apt-get install --no-install-recommends$missing"
    exit 0
fi

echo "installing Debian packages:$missing"
# policy-rc.d (Debian's switch for package scripts) keeps the nginx package from starting a
# root nginx on port 80: the tests start their own, unprivileged, on high ports.
policy=/usr/sbin/policy-rc.d
made_policy=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi
status=0
apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends $missing || status=$?
[ -n "$made_policy" ] && rm -f "$policy"
if [ "$status" != 0 ]; then
    echo "warning: apt-get failed (status $status);" \
        "tests that need$missing will be skipped" >&2
fi
exit 0
