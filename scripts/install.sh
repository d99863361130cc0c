#!/usr/bin/env bash
# Install ingero on this machine as the units expect it: the wheel in /opt/ingero/venv (made from
# Debian's Python, so that Debian's bcc is visible), the systemd units, the Slurm hooks, the
# manual pages and the monitoring files. Safe to run again. ROOT=DIR installs under DIR instead
# of / (packaging, tests); WHEEL=FILE installs that wheel instead of building one from this
# checkout.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "ingero install must run as root: it writes /opt/ingero, /etc/systemd/system and /etc/slurm" >&2
    exit 1
fi

here=$(cd "$(dirname "$0")/.." && pwd)
root=${ROOT:-}
venv=$root/opt/ingero/venv
python=${PYTHON:-/usr/bin/python3}

wheel=${WHEEL:-}
if [ -z "$wheel" ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    "$python" -m pip wheel -q --no-deps -w "$out" "$here"
    wheel=$(ls "$out"/ingero-*.whl)
fi

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv"
fi
# the checkout's code even when its version number did not change, then what it depends on
# (echod's too: this machine may run every part), at the versions the tests ran with
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
"$venv/bin/pip" install -q -c "$here/constraints.txt" "$wheel[head]"

install -d -m 0755 "$root/etc/systemd/system" "$root/etc/slurm/ingero" "$root/etc/ingero"
install -m 0644 "$here"/systemd/*.service "$root/etc/systemd/system/"
install -m 0755 "$here/slurm/prolog" "$root/etc/slurm/ingero/prolog"
install -m 0755 "$here/slurm/epilog" "$root/etc/slurm/ingero/epilog"
# echod's audit log, rotated weekly (echod reopens it on reload)
install -d -m 0755 "$root/etc/logrotate.d"
install -m 0644 "$here/logrotate/ingero" "$root/etc/logrotate.d/ingero"
# the alert rules, their tests, the example Prometheus and Alertmanager files, the dashboards
shared=$root/usr/local/share/ingero/monitoring
install -d -m 0755 "$shared/tests" "$shared/grafana/dashboards" "$shared/grafana/provisioning"
install -m 0644 "$here"/monitoring/*.yml "$shared/"
install -m 0644 "$here"/monitoring/tests/*.yml "$shared/tests/"
install -m 0644 "$here"/monitoring/grafana/dashboards/*.json "$shared/grafana/dashboards/"
install -m 0644 "$here"/monitoring/grafana/provisioning/*.yaml "$shared/grafana/provisioning/"
for page in "$here"/man/*.[1-8]; do
    section=${page##*.}
    install -d -m 0755 "$root/usr/local/share/man/man$section"
    install -m 0644 "$page" "$root/usr/local/share/man/man$section/"
done

if [ -z "$root" ]; then
    # fleetd and echod run as this user (systemd/fleetd.service, systemd/echod.service)
    id ingero >/dev/null 2>&1 || useradd --system --home-dir /var/lib/ingero --no-create-home \
        --shell /usr/sbin/nologin ingero
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        # the daemons that ran the code just replaced run the new code (those stopped stay so)
        systemctl try-restart ingerod.service fleetd.service echod.service
    fi
fi
echo "ingero $("$venv/bin/python" -c 'import ingero; print(ingero.__version__)') installed in $venv"
