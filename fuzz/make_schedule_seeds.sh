#!/usr/bin/env bash
# Regenerates fuzz/corpus_schedule/ with a built mk: schedule files carry the tile sizes of include/mk/tiles.h, so
# the seeds are remade whenever those change. Usage: fuzz/make_schedule_seeds.sh build/mk
set -euo pipefail
mk=${1:?usage: $0 path/to/mk}
dir=$(dirname "$0")/corpus_schedule
rm -f "$dir"/*
"$mk" schedule --preset tiny --batch 1 --seq 8 --sms 2 --out "$dir/valid-tiny-1x8-2sms" >/dev/null
"$mk" schedule --preset tiny --batch 2 --seq 3 --sms 3 --policy round-robin --out "$dir/valid-tiny-2x3-round-robin" >/dev/null
"$mk" schedule --preset tiny --decode --batch 2 --max-context 128 --sms 3 --out "$dir/valid-tiny-decode-2x128" >/dev/null
# Invalid seeds: the first valid file with its header or an instruction changed.
python3 - "$dir" <<'PY'
import json, struct, sys
d = sys.argv[1] + "/"
b = open(d + "valid-tiny-1x8-2sms", "rb").read()
n = struct.unpack("<Q", b[8:16])[0]
header, rest = json.loads(b[16:16 + n]), b[16 + n:]
def write(name, edit):
    h = json.loads(json.dumps(header)); edit(h); t = json.dumps(h).encode()
    open(d + name, "wb").write(b[:8] + struct.pack("<Q", len(t)) + t + rest)
write("invalid-counters-200m", lambda h: h.update(num_counters=200_000_000))
write("invalid-max-position-1e24", lambda h: h["config"].update(max_position_embeddings=1e24))
flipped = bytearray(b); flipped[16 + n + (header["num_sms"] + 1) * 4] ^= 3  # the first instruction's opcode
open(d + "invalid-opcode-flipped", "wb").write(bytes(flipped))
PY
