#!/usr/bin/env bash
# Fail early, with a sentence instead of a stack trace, when the machine lacks what `make` needs.
set -u
python=${1:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: $python not found. Install Python 3.11 or newer (Debian/Ubuntu: sudo apt-get install python3 python3-venv)." >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "error: $("$python" --version 2>&1) is too old; Python 3.11 or newer is required (make PYTHON=python3.12 ...)." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ] && ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "python venv support is missing; installing python3-venv with apt" >&2
  scripts/system-packages.sh python3-venv || exit 1
fi
exit 0
