#!/usr/bin/env bash
# Installs what the project builds with, from Debian packages (the CUDA toolkit, when wanted, comes from NVIDIA).
set -euo pipefail
packages=(cmake g++ make libgtest-dev libgmock-dev nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev pkg-config)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update
$sudo apt-get install -y --no-install-recommends "${missing[@]}"
