#!/usr/bin/env bash
# Installs what the project builds with: Debian packages (the CUDA toolkit, when wanted, comes from NVIDIA), and from
# PyPI what the Python package builds and tests with (torch stays optional: its tests skip without it).
set -euo pipefail
packages=(cmake g++ make libgtest-dev libgmock-dev nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev pkg-config
  python3-dev python3-pip)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all Debian packages present"
else
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The python3 on PATH is the one CMake builds the extension for and the tests run with.
if python3 -c "import scikit_build_core, nanobind, numpy, pytest" >/dev/null 2>&1; then
  echo "setup: all Python packages present"
else
  pip_flags=()
  # NOTE: Debian's own python3 refuses pip installs outside a virtual environment (PEP 668); inside one, or with a
  # python3 of its own (pyenv, conda), nothing is refused. Activate a venv before this script to keep Debian's clean.
  if python3 -c "import sys, sysconfig, os; sys.exit(sys.prefix != sys.base_prefix or not os.path.exists(
      os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"; then
    pip_flags+=(--break-system-packages)
  fi
  python3 -m pip install "${pip_flags[@]}" "scikit-build-core>=0.10" "nanobind>=2.0" numpy pytest
fi
