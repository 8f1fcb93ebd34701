#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver, which the load-test report's browser test drives through selenium
# (headless, offline: nothing is downloaded at run time).
#
#   deploy/local/install-browser.sh
#
# Idempotent: when /usr/bin/chromium and /usr/bin/chromedriver are both there, it only prints their versions.
# A system install is needed here (unlike fetch-prometheus-tools.sh's dpkg -x): chromium pulls in dozens of
# shared libraries that only apt resolves.
#
# Exit status: 0 when both are installed; 3 when this machine cannot install them (not root, no apt-get, or the
# packages are not in its apt sources), with what to do instead; anything else is a real failure.
set -euo pipefail

readonly PACKAGES=(chromium chromium-driver)
readonly BROWSER=/usr/bin/chromium
readonly DRIVER=/usr/bin/chromedriver

cannot() {
    cat >&2 <<MSG
install-browser: $1
This script installs Debian's ${PACKAGES[*]} with apt-get, as root (Debian 12 / Ubuntu with the chromium
packages). Elsewhere, install a Chromium and the matching chromedriver yourself so that $BROWSER and $DRIVER
exist; until then the report's browser test skips and says why.
MSG
    exit 3
}

versions() {
    "$BROWSER" --version 2>/dev/null | head -n 1
    "$DRIVER" --version 2>&1 | head -n 1
}

if [[ -x $BROWSER && -x $DRIVER ]]; then
    versions
    exit 0
fi

[[ $(id -u) -eq 0 ]] || cannot "not running as root (apt-get install needs root; try: sudo $0)."
command -v apt-get >/dev/null 2>&1 || cannot "apt-get was not found."

log=$(mktemp)
trap 'rm -f -- "$log"' EXIT

install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$log" 2>&1
}

if ! install; then
    # A fresh container has no package lists: refresh them once and retry.
    echo "install-browser: apt-get install failed; running apt-get update once" >&2
    apt-get update -q >"$log" 2>&1 || {
        cat "$log" >&2
        cannot "apt-get update failed (no network to the package mirror?)."
    }
    if ! install; then
        cat "$log" >&2
        cannot "apt-get install ${PACKAGES[*]} failed (packages not in this machine's apt sources?)."
    fi
fi

for path in "$BROWSER" "$DRIVER"; do
    [[ -x $path ]] || {
        echo "install-browser: $path is missing after installing ${PACKAGES[*]}" >&2
        exit 1
    }
done
versions
