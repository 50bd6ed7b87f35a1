#!/usr/bin/env bash
# Prepares .gpu-deps/ for a GPU machine that has no package registry: PCRE2's headers and libraries (the tokenizer's
# regexes) unpacked from Debian packages, to be carried to the machine; scripts/gpu_check.sh uses them when the
# machine's pkg-config does not know libpcre2-8.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.gpu-deps
rm -rf "$deps" && mkdir -p "$deps/debs" "$deps/pcre2"
(cd "$deps/debs" && apt-get download libpcre2-dev libpcre2-8-0)
for deb in "$deps"/debs/*.deb; do dpkg -x "$deb" "$deps/pcre2"; done
rm -rf "$deps/debs"
echo "prepared $deps ($(du -sh "$deps" | cut -f1)); carry .gpu-deps with the run"
