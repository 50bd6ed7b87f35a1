"""Compares the generated tokens of two `mk generate` logs of the same prompts and weights.
Reads each log's `tokens:` lines (prompt and generated ids, one line per sequence) and says whether they agree, or the
first sequence and position (counted from the prompt's start) where they part. gpu_check.sh's ab_decode step uses it
on each tree's traced run, so that an A/B also says whether a change moved the tokens.
Usage: compare_tokens.py NEW_LOG OLD_LOG (exit status 0 in every case: parting is a finding, not an error; 2 for
unreadable input)."""
import argparse
import sys
from pathlib import Path


def sequences(path: Path) -> list[list[str]]:
    """The token ids of each `tokens:` line of a log, in order."""
    with path.open(errors="replace") as log:
        return [line.split()[1:] for line in log if line.startswith("tokens:")]


def verdict(new: list[list[str]], old: list[list[str]]) -> str:
    if not new or not old:
        return f"tokens not compared: {len(new)} and {len(old)} sequences in the logs"
    if len(new) != len(old):
        return f"tokens not compared: {len(new)} sequences against {len(old)}"
    for index, (a, b) in enumerate(zip(new, old)):
        for position, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"tokens part at position {position} (prompt included) of sequence {index} ({x} against {y})"
        if len(a) != len(b):
            return f"tokens part in sequence {index}: {len(a)} ids against {len(b)}"
    return f"tokens the same ({len(new)} sequences)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("new_log", type=Path)
    parser.add_argument("old_log", type=Path)
    args = parser.parse_args()
    try:
        print(verdict(sequences(args.new_log), sequences(args.old_log)))
    except OSError as error:
        print(f"compare_tokens.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
