#!/usr/bin/env python3
"""Prints where the megakernel's warps wait, by source line.

It joins Nsight Compute's per-SASS-instruction stall samples with the source lines (inlining included) of an
`nvdisasm -gi` listing of the same cubin; scripts/ncu_profile.sh writes both (NAME-source.csv.gz and
NAME-sass-lines.txt.gz). Each instruction's samples go to the innermost frame of its inline chain that is not a
helper: the CUDA headers and the project's mechanism files (ptx.cuh, sync.cuh, and output_tile.cuh, whose tile
writes are charged to the epilogue that calls them), so that a barrier wait counts for the op that waits, not for
ptx.cuh; --range shows the helpers' lines. --range LO-HI (SASS offsets, hex) instead prints the
instructions of one stretch of code with their samples: the view that found the epilogue's load-store chains
(docs/perf.md, thirteenth session, run 1).

Each run prints the kernel's samples by stall reason first (where a change moved samples: two builds' profiles
side by side, sixteenth session). --stall NAME ranks the lines by that reason's samples alone (no_inst: the code
the instruction cache misses; long_sb: the lines waiting on global memory).

Usage: ncu_stalls.py NAME-source.csv.gz NAME-sass-lines.txt.gz [--top 30] [--stall no_inst]
           [--range 3a680-423a0 --min-samples 50]
"""
import argparse
import csv
import gzip
import io
import re
import sys

# The project's files whose lines are the mechanism, not the op: their samples go to the caller's line, as do those
# of every file outside the project's src/ (the CUDA headers).
HELPER_FILES = ("ptx.cuh", "sync.cuh", "output_tile.cuh")
FRAME = re.compile(r'File "([^"]*)", line (\d+)')
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+([@A-Z{].*?)\s*;?\s*$")


def open_text(path):
    return io.TextIOWrapper(gzip.open(path), encoding="utf-8") if path.endswith(".gz") else open(path)


def read_samples(path):
    """Rows of ncu's source page: (offset from the kernel's first instruction, SASS text, samples, {stall: samples})."""
    rows = list(csv.reader(open_text(path)))
    at = next((i for i, row in enumerate(rows) if row and row[0] == "Address"), None)
    if at is None:
        raise SystemExit(f"{path}: no 'Address' header: not ncu's --page source --csv output")
    header = rows[at]
    if "Warp Stall Sampling (All Samples)" not in header:
        raise SystemExit(f"{path}: no 'Warp Stall Sampling (All Samples)' column: profile with the SourceCounters "
                         f"section (ncu --set full)")
    samples_column = header.index("Warp Stall Sampling (All Samples)")
    stall_columns = [(i, name[len("stall_"):]) for i, name in enumerate(header)
                     if name.startswith("stall_") and "(Not Issued)" not in name]
    data = [row for row in rows[at + 1:] if len(row) == len(header) and row[0].startswith("0x")]
    if not data:
        raise SystemExit(f"{path}: no instructions")
    base = int(data[0][0], 16)
    return [(int(row[0], 16) - base, row[1].strip(), int(row[samples_column] or 0),
             {name: int(row[i] or 0) for i, name in stall_columns}) for row in data]


def opcode(sass):
    """The instruction's opcode, its predicate left out: what both tools print alike."""
    words = sass.split()
    words = words[1:] if words and words[0].startswith("@") else words
    return words[0].split(".")[0] if words else ""


def is_helper(path):
    name = path.rsplit("/", 1)[-1]
    return name in HELPER_FILES or "/src/" not in path


def read_lines(path):
    """{kernel: {SASS offset -> (the instruction's inline chain of (file:line, helper?) frames, innermost first; its
    opcode)}}, from `nvdisasm -gi`, for each megakernel compilation (a listing has one .text section per function;
    the forward, decode and narrow decode kernels share the cubin, each with offsets from its own start)."""
    kernels, chains, chain, fresh = {}, None, [], True
    for line in open_text(path):
        if line.startswith("//-----") and " .text." in line:
            name = line.split(" .text.", 1)[1].split()[0]
            chains = kernels.setdefault(name, {}) if "megakernel" in name else None
            continue
        if chains is None:
            continue
        if "//## File" in line:
            if fresh:
                chain, fresh = [], False
            frames = FRAME.findall(line)
            if frames:
                chain.append((f"{frames[0][0].rsplit('/', 1)[-1]}:{frames[0][1]}", is_helper(frames[0][0])))
            continue
        match = INSTRUCTION.match(line)
        if match:
            fresh = True
            chains[int(match.group(1), 16)] = (tuple(chain), opcode(match.group(2)))
    kernels = {name: chains for name, chains in kernels.items() if chains}
    if not kernels:
        raise SystemExit(f"{path}: no megakernel instructions: not an `nvdisasm -gi` listing of its cubin")
    return kernels


def profiled_kernel(samples, kernels, path):
    """The chains of the kernel the profile sampled: the compilation whose opcodes agree with the profile's at every
    sampled offset (all but 1%); fails when none does, a listing of another build."""
    def differ(chains):
        return sum(1 for offset, sass, _, _ in samples if chains.get(offset, ((), ""))[1] != opcode(sass))
    name = min(kernels, key=lambda k: differ(kernels[k]))
    fewest = differ(kernels[name])
    if fewest > len(samples) // 100:
        raise SystemExit(f"{path}: {fewest} of {len(samples)} instructions differ from the profile's in the closest "
                         f"kernel ({name}): a listing of another build")
    return kernels[name]


def owner(chain):
    """The innermost frame outside the helpers, else the innermost."""
    for frame, helper in chain:
        if not helper:
            return frame
    return chain[0][0] if chain else "?"


def by_line(samples, chains):
    """{source line: [samples, {stall: samples}]}, over every sampled instruction."""
    lines = {}
    for offset, _, count, stalls in samples:
        entry = lines.setdefault(owner(chains.get(offset, ((), ""))[0]), [0, {}])
        entry[0] += count
        for stall, n in stalls.items():
            entry[1][stall] = entry[1].get(stall, 0) + n
    return lines


def stall_totals(samples):
    """{stall: samples} over every instruction."""
    totals = {}
    for _, _, _, stalls in samples:
        for stall, n in stalls.items():
            totals[stall] = totals.get(stall, 0) + n
    return totals


def top_stalls(stalls, n=4):
    return " ".join(f"{name}:{count}" for name, count in sorted(stalls.items(), key=lambda s: -s[1])[:n] if count)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_csv", help="ncu --page source --csv --print-source sass (may be .gz)")
    parser.add_argument("sass_lines", help="nvdisasm -gi of the same cubin (may be .gz)")
    parser.add_argument("--top", type=int, default=30, help="source lines to print, most samples first")
    parser.add_argument("--stall", help="rank the lines by this stall reason's samples (e.g. no_inst, long_sb)")
    parser.add_argument("--range", help="LO-HI: print the instructions of this stretch of SASS offsets (hex)")
    parser.add_argument("--min-samples", type=int, default=1, help="--range: leave out instructions with fewer")
    args = parser.parse_args()
    samples = read_samples(args.source_csv)
    chains = profiled_kernel(samples, read_lines(args.sass_lines), args.sass_lines)
    total = sum(s[2] for s in samples) or 1
    if args.range:
        low, high = (int(x, 16) for x in args.range.split("-"))
        chosen = [s for s in samples if low <= s[0] <= high]
        for offset, sass, count, stalls in chosen:
            if count >= args.min_samples:
                chain = ",".join(frame for frame, _ in chains.get(offset, ((), ""))[0][:3])
                print(f"{offset:06x} {count:6d} {sass[:48]:48s} {top_stalls(stalls, 3):40s} {chain}")
        inside = sum(s[2] for s in chosen)
        print(f"{len(chosen)} instructions, {inside} samples ({100 * inside / total:.1f}% of the kernel's)")
        return 0
    totals = stall_totals(samples)
    if args.stall is not None and args.stall not in totals:
        raise SystemExit(f"no stall reason '{args.stall}' in the profile; it has: {', '.join(sorted(totals))}")
    print("by stall reason: " + ", ".join(f"{name} {100 * count / total:.1f}%" for name, count in
                                          sorted(totals.items(), key=lambda item: -item[1]) if count))
    lines = by_line(samples, chains)
    rank = (lambda item: -item[1][1].get(args.stall, 0)) if args.stall else (lambda item: -item[1][0])
    print(f"{total} samples over {len(samples)} instructions; by source line (helpers charged to their caller)"
          + (f", most {args.stall} first:" if args.stall else ":"))
    for line, (count, stalls) in sorted(lines.items(), key=rank)[:args.top]:
        print(f"  {line:32s} {count:7d} {100 * count / total:5.1f}%  {top_stalls(stalls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
