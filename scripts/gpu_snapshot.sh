#!/usr/bin/env bash
# Copies committed trees into .gpu-snap/ for one call to a GPU machine: REF's tree at its root and, for A/B timing in
# the same call, OLD_REF's under .gpu-snap/old/ (and OLD2_REF's under old2/: three builds alternating); each names
# its commit in a COMMIT file (bench.py and gpu_check.sh report it: the copy is no git checkout). .gpu-deps
# (scripts/prepare_gpu_deps.sh) goes along. Carry .gpu-snap.
# NOTE: trees older than this script's have a bench.py and gpu_check.sh that report the enclosing checkout's HEAD;
# take an old tree's commit from old/COMMIT.
# Usage: scripts/gpu_snapshot.sh REF [OLD_REF [OLD2_REF]]
set -euo pipefail
ref=${1:?usage: scripts/gpu_snapshot.sh REF [OLD_REF [OLD2_REF]]}
old=${2:-}
old2=${3:-}
if [ -n "$old2" ] && [ -z "$old" ]; then
  echo "gpu_snapshot.sh: OLD2_REF needs OLD_REF" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
snap=$root/.gpu-snap
for r in "$ref" ${old:+"$old"} ${old2:+"$old2"}; do
  if ! git -C "$root" rev-parse --verify --quiet "$r^{commit}" >/dev/null; then
    echo "gpu_snapshot.sh: no commit '$r'" >&2
    exit 2
  fi
done
copy_tree() {  # copy_tree REF DIR
  mkdir -p "$2"
  git -C "$root" archive "$1" | tar -x -C "$2"
  git -C "$root" rev-parse --short "$1^{commit}" >"$2/COMMIT"
}
rm -rf "$snap"
copy_tree "$ref" "$snap"
if [ -n "$old" ]; then copy_tree "$old" "$snap/old"; fi
if [ -n "$old2" ]; then copy_tree "$old2" "$snap/old2"; fi
if [ -d "$root/.gpu-deps" ]; then
  cp -r "$root/.gpu-deps" "$snap/"
else
  echo "note: no .gpu-deps here (scripts/prepare_gpu_deps.sh): the GPU machine must have PCRE2 itself" >&2
fi
echo "$snap: $(cat "$snap/COMMIT")${old:+, old/: $(cat "$snap/old/COMMIT")}${old2:+, old2/: $(cat "$snap/old2/COMMIT")}" \
  "($(du -sh "$snap" | cut -f1))"
