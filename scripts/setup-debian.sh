#!/usr/bin/env bash
# Prepare a Debian 12 machine for ingero: Debian packages, kernel headers for bcc,
# tracefs, and a virtual environment that sees Debian's bcc. Safe to run again.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "ingero setup must run as root: eBPF tracing needs CAP_BPF and CAP_PERFMON, and the setup installs Debian packages" >&2
    exit 1
fi

here=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$here/.venv}

packages=(
    python3 python3-venv python3-dev gcc make
    python3-bpfcc bpfcc-tools libbpfcc linux-headers-amd64
    postgresql postgresql-15
    slurmctld slurmd slurm-client slurmdbd mariadb-server munge
    faketime mandoc systemd iproute2 procps openssl logrotate
    prometheus prometheus-alertmanager
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Do not let package scripts start services (slurm, munge, postgresql) here:
    # the tests and the demo start their own, with their own configuration.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    rm -f /usr/sbin/policy-rc.d
fi

# bcc compiles BPF C against the running kernel's headers. These machines run a custom kernel
# with no headers package, so point the module tree at Debian's generic headers.
kdir=/lib/modules/$(uname -r)
hdr_arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
hdr_common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
if [ -n "$hdr_arch" ] && [ -n "$hdr_common" ]; then
    mkdir -p "$kdir"
    [ -e "$kdir/build" ] || ln -sfn "$hdr_arch" "$kdir/build"
    [ -e "$kdir/source" ] || ln -sfn "$hdr_common" "$kdir/source"
fi

# uprobe attach and cleanup go through tracefs.
if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

# A virtual environment from Debian's interpreter, with Debian's bcc visible.
if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp=$venv/.installed
if [ ! -e "$stamp" ] || [ "$here/setup.cfg" -nt "$stamp" ] || [ "$here/constraints.txt" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -c "$here/constraints.txt" -e "$here[head,test]"
    touch "$stamp"
fi
