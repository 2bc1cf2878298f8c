#!/usr/bin/env bash
# Install the Debian packages given as arguments when their programs are missing (apt-get, as root or
# through sudo). Says what it installs; fails with a clear message where apt is not available.
set -u
declare -A program=([tesseract-ocr]=tesseract [chromium]=chromium [python3-venv]= [redis-server]=redis-server [postgresql]=)
missing=()
for pkg in "$@"; do
  bin=${program[$pkg]-}
  if [ -n "$bin" ]; then
    command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
  else
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing system packages: ${missing[*]}. Install them with your package manager and retry." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "error: missing system packages: ${missing[*]}; run: apt-get install ${missing[*]} (as root)" >&2
    exit 1
  fi
fi
echo "installing system packages with apt: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q "${missing[@]}" >/dev/null; } || {
  echo "error: apt-get could not install ${missing[*]}" >&2
  exit 1
}
