#!/usr/bin/env bash
# Makes sure the Debian packages the tests use are installed: `chromium` (the viewer's
# browser tests; Playwright drives it, nothing ever downloads a browser), `bubblewrap`
# (ProcessBackend's sandbox and the Harbor tests' environment) and `strace` (a test counts
# the rollout server's fsync calls).
# Usage: ensure_debian_packages.sh COMMAND=PACKAGE ...   (e.g. chromium=chromium bwrap=bubblewrap)
set -euo pipefail
missing=()
for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    "${install[@]}"
elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -q
    sudo DEBIAN_FRONTEND=noninteractive "${install[@]}"
else
    echo "The tests need these Debian packages: ${missing[*]} (apt-get install ${missing[*]})." >&2
    exit 1
fi
