#!/usr/bin/env bash
# Nsight Compute on one megakernel launch: the figures that say which resource limits it (tensor pipe, L2, DRAM,
# issue slots) and where in the SASS the warps wait.
# Usage: scripts/ncu_profile.sh OUT_DIR NAME MK_BINARY MK_COMMAND [options...]
#   e.g. ... build/mk run --preset seed --engine gpu --iterations 2, or ... build/mk generate --preset llama-3.2-1b
#   --engine gpu --prompt-ids 1,2,3 --max-new-tokens 12 with NCU_SKIP=4 (a decode step past the prefill).
#   NCU_SKIP: megakernel launches to let pass first (default 1: a warm launch; the first pays for cold instruction
#   and L2 caches). Clocks are left alone (--clock-control none).
#   Writes OUT_DIR/NAME.ncu-rep.gz, NAME-details.txt (every section), NAME-source.csv.gz (per-SASS-instruction
#   samples) and NAME-sass-lines.txt.gz (nvdisasm -gi of the megakernel's cubin): scripts/ncu_stalls.py joins the
#   last two into stall samples by source line.
set -uo pipefail
out=${1:?usage: scripts/ncu_profile.sh OUT_DIR NAME MK_BINARY MK_COMMAND [options...]}
name=${2:?name}
mk=$(realpath "${3:?mk binary}")  # absolute: cuobjdump runs in another directory below
shift 3
[ $# -gt 0 ] || { echo "ncu_profile.sh: no mk command (run, generate, ...)" >&2; exit 2; }
mkdir -p "$out"
ncu --set full --import-source yes --clock-control none -k regex:megakernel --launch-skip "${NCU_SKIP:-1}" \
  --launch-count 1 -f -o "$out/$name" "$mk" "$@" >"$out/$name-ncu.log" 2>&1 || {
  echo "ncu failed:"
  tail -n 20 "$out/$name-ncu.log"
  exit 1
}
ncu -i "$out/$name.ncu-rep" --page details >"$out/$name-details.txt"
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/$name-source.csv.gz"
gzip -f "$out/$name.ncu-rep"
cubins=$(mktemp -d)
(cd "$cubins" && cuobjdump -xelf all "$mk" >/dev/null 2>&1)
cubin=$(grep -l megakernel "$cubins"/*.cubin 2>/dev/null | head -1)
if [ -n "$cubin" ]; then
  nvdisasm -gi "$cubin" | gzip >"$out/$name-sass-lines.txt.gz"
else
  echo "ncu_profile.sh: no megakernel cubin in $mk: no source lines for ncu_stalls.py"
fi
rm -rf "$cubins"
headline="Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|DRAM Throughput|Issue Slots Busy"
headline+="|Executed Ipc Active|Tensor|L2 Cache Throughput|Max Bandwidth|Mem Pipes Busy"
grep -E "$headline" "$out/$name-details.txt" | head -40
