#!/usr/bin/env bash
# Fetch promtool/prometheus and amtool/alertmanager from Debian's `prometheus` and `prometheus-alertmanager`
# packages into DIR (default .cache/prometheus-tools), without installing anything system-wide:
# `apt-get download` + `dpkg -x`. The binaries land in DIR/usr/bin.
#
#   deploy/local/fetch-prometheus-tools.sh [DIR]
#
# Idempotent: a marker file says DIR is complete, and a second run only prints the versions. DIR is never left
# half-populated: the packages are extracted into a temporary directory beside it, then renamed into place.
#
# Exit status: 0 when the tools are in DIR; 3 when this machine cannot fetch them (no apt-get or dpkg, or the
# packages are not in its apt sources), with what to do instead; anything else is a real failure.
set -euo pipefail

readonly PACKAGES=(prometheus prometheus-alertmanager)
readonly MARKER=.complete
readonly NEED="promtool/prometheus 2.42+ and amtool/alertmanager 0.25+"

dir=${1:-.cache/prometheus-tools}

cannot() {
    cat >&2 <<MSG
fetch-prometheus-tools: $1
This script needs apt-get and dpkg (Debian 12 / Ubuntu 23.04 or later) to fetch $NEED.
Elsewhere, download the release archives from the Prometheus project (prometheus-*.linux-*.tar.gz and
alertmanager-*.linux-*.tar.gz) and put the four binaries promtool, prometheus, amtool and alertmanager
under $dir/usr/bin, then run: touch $dir/$MARKER
MSG
    exit 3
}

versions() {
    local bin=$dir/usr/bin
    "$bin/promtool" --version 2>&1 | head -n 1
    "$bin/prometheus" --version 2>&1 | head -n 1
    "$bin/amtool" --version 2>&1 | head -n 1
    "$bin/alertmanager" --version 2>&1 | head -n 1
}

if [[ -f $dir/$MARKER ]]; then
    versions
    exit 0
fi

command -v apt-get >/dev/null 2>&1 || cannot "apt-get was not found."
command -v dpkg >/dev/null 2>&1 || cannot "dpkg was not found."

parent=$(dirname -- "$dir")
mkdir -p -- "$parent"
work=$(mktemp -d "$parent/.prometheus-tools.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

download() {
    # apt-get download writes into the current directory; a subshell keeps ours.
    (cd -- "$work" && apt-get download -q "${PACKAGES[@]}") >"$work/download.log" 2>&1
}

if ! download; then
    # A fresh container has no package lists: refresh them once and retry (root only).
    if [[ $(id -u) -eq 0 ]]; then
        echo "fetch-prometheus-tools: apt-get download failed; running apt-get update once" >&2
        apt-get update -q >"$work/update.log" 2>&1 || {
            cat "$work/update.log" >&2
            cannot "apt-get update failed (no network to the Debian mirror?)."
        }
    fi
    if ! download; then
        cat "$work/download.log" >&2
        cannot "apt-get download ${PACKAGES[*]} failed (packages not in this machine's apt sources?)."
    fi
fi

mkdir -- "$work/root"
for deb in "$work"/*.deb; do
    dpkg -x "$deb" "$work/root"
done
# Debian names the Alertmanager binary prometheus-alertmanager; the upstream name is what the tests call.
if [[ ! -e $work/root/usr/bin/alertmanager && -x $work/root/usr/bin/prometheus-alertmanager ]]; then
    ln -s prometheus-alertmanager "$work/root/usr/bin/alertmanager"
fi
for tool in promtool prometheus amtool alertmanager; do
    [[ -x $work/root/usr/bin/$tool ]] || {
        echo "fetch-prometheus-tools: $tool is missing from the extracted packages" >&2
        exit 1
    }
done
(cd -- "$work" && ls -- *.deb) >"$work/root/$MARKER"

# Another run may have finished first; keep its result rather than replacing a directory in use.
if [[ -f $dir/$MARKER ]]; then
    versions
    exit 0
fi
rm -rf -- "$dir"
mv -- "$work/root" "$dir"
versions
