#!/usr/bin/env bash
# Dumps the SASS of a megakernel build, with a line of counts per kernel; no GPU needed. cuobjdump is the toolkit's
# where it has one (the GPU machine), else PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels in .tools/
# (this machine's toolkit ships nvcc and ptxas but neither of those).
# Usage: scripts/sass.sh [BUILD_DIR [KERNEL [OUT]]]   (KERNEL: megakernel, megakernel_decode, megakernel_decode_narrow,
#        megakernel_decode_wgmma; default all, also for an empty KERNEL) -> OUT (default BUILD_DIR/megakernel.sass).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
kernel=${2:-}
out=${3:-$build/megakernel.sass}
tools=$root/.tools
cuobjdump=$(command -v cuobjdump || true)
if [ -z "$cuobjdump" ]; then
  [ -d "$tools" ] && cuobjdump=$(find "$tools" -name cuobjdump -type f | head -1)
  if [ -z "$cuobjdump" ]; then
    quiet=--quiet
    [ -t 1 ] && quiet=  # pip's progress on a terminal only
    python3 -m pip install ${quiet:+"$quiet"} --target "$tools" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    cuobjdump=$(find "$tools" -name cuobjdump -type f | head -1)
  fi
  PATH=$(dirname "$cuobjdump"):$PATH  # cuobjdump runs nvdisasm, which the same wheels put beside it
fi
obj=$(find "$build" -name 'megakernel.cu.o' | head -1)
if [ -z "$obj" ]; then
  echo "sass.sh: no megakernel.cu.o under $build (build it first)" >&2
  exit 2
fi
if [ -n "$kernel" ]; then
  "$cuobjdump" -sass -fun "_ZN2mk3gpu${#kernel}${kernel}ENS0_16MegakernelParamsE" "$obj" >"$out"
else
  "$cuobjdump" -sass "$obj" >"$out"
fi
# Per kernel: instructions, tensor-core MMAs, local-memory accesses (spills), and the gpu-scope fences a chain pays.
awk '/Function :/ { name = $3 }
     /\/\*[0-9a-f]+\*\// && name != "" { n[name]++ }
     /HGMMA|HMMA/ { mma[name]++ }
     /STL|LDL/ { local[name]++ }
     /MEMBAR.*GPU/ { fence[name]++ }
     END { for (k in n) printf "%s: %d instructions, %d MMA, %d local-memory, %d gpu fences\n", k, n[k], mma[k] + 0,
                                local[k] + 0, fence[k] + 0 }' "$out"
echo "wrote $out"
