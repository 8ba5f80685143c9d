#!/usr/bin/env bash
# Makes sure Debian's headless Chromium is installed, for the viewer's browser tests.
# Playwright drives this browser; nothing ever downloads one (`playwright install` is not used).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
install=(apt-get install -y -q --no-install-recommends chromium)
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    "${install[@]}"
elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -q
    sudo DEBIAN_FRONTEND=noninteractive "${install[@]}"
else
    echo "The browser tests need Chromium: install Debian's 'chromium' package (apt-get install chromium)." >&2
    exit 1
fi
