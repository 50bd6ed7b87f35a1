#!/usr/bin/env bash
# Nsight Compute on one warm megakernel launch: the figures that say which resource limits it (tensor pipe, L2,
# DRAM, issue slots) and where in the SASS the warps wait.
# Usage: scripts/ncu_profile.sh OUT_DIR NAME MK_BINARY [mk run options...]
#   writes OUT_DIR/NAME.ncu-rep, NAME-details.txt (every section) and NAME-source.csv (per-SASS-line samples)
set -uo pipefail
out=${1:?usage: scripts/ncu_profile.sh OUT_DIR NAME MK_BINARY [mk run options...]}
name=${2:?name}
mk=${3:?mk binary}
shift 3
mkdir -p "$out"
# NOTE: --launch-skip 1 profiles a warm launch (the first one pays for cold instruction and L2 caches).
ncu --set full --import-source yes -k regex:megakernel --launch-skip 1 --launch-count 1 -f -o "$out/$name" \
  "$mk" run --engine gpu --iterations 2 "$@" >"$out/$name-ncu.log" 2>&1 || {
  echo "ncu failed:"
  tail -n 20 "$out/$name-ncu.log"
  exit 1
}
ncu -i "$out/$name.ncu-rep" --page details >"$out/$name-details.txt"
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/$name-source.csv" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|Tensor|L2 Cache Throughput|Max Bandwidth|Mem Pipes Busy" \
  "$out/$name-details.txt" | head -40
