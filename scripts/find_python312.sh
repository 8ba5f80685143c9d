#!/usr/bin/env bash
# Prints a Python 3.12+ interpreter for the Harbor tests (Harbor needs 3.12): `python3.12` or
# `python3.13` on PATH, else one installed by pyenv. Fails loudly when there is none.
set -euo pipefail
for candidate in python3.12 python3.13; do
    if path=$(command -v "$candidate" 2>/dev/null) && "$path" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
        echo "$path"
        exit 0
    fi
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for path in "$root"/versions/3.12*/bin/python3.12 "$root"/versions/3.13*/bin/python3.13; do
    if [ -x "$path" ]; then
        echo "$path"
        exit 0
    fi
done
echo "The Harbor tests need Python 3.12 or newer (Harbor requires it); none was found on PATH or in pyenv. Install one (e.g. pyenv install 3.12)." >&2
exit 1
