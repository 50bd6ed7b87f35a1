"""Tests of scripts/compare_tokens.py: agreement, the first place two logs' tokens part, and logs it cannot compare."""
import importlib.util
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "compare_tokens.py"
spec = importlib.util.spec_from_file_location("compare_tokens", SCRIPT)
compare_tokens = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_tokens)


def check(condition: bool, message: str) -> None:
    if not condition:
        print(f"FAILED: {message}")
        sys.exit(1)


def run(new_text: str, old_text: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as work:
        new, old = pathlib.Path(work, "new.log"), pathlib.Path(work, "old.log")
        new.write_text(new_text)
        old.write_text(old_text)
        return subprocess.run([sys.executable, str(SCRIPT), str(new), str(old)], capture_output=True, text=True)


LOG = "prefill: 3 ms\ntokens: 1 2 3 40 41\ntokens: 1 2 3 50 51\n"
same = run(LOG, "noise\n" + LOG)
check(same.returncode == 0 and same.stdout.strip() == "tokens the same (2 sequences)", f"agreement: {same.stdout!r}")
parted = run(LOG, LOG.replace("50 51", "50 52"))
check(parted.stdout.strip() == "tokens part at position 4 (prompt included) of sequence 1 (51 against 52)",
      f"parting: {parted.stdout!r}")
check(compare_tokens.verdict([["1", "2"]], [["1", "2", "3"]]) == "tokens part in sequence 0: 2 ids against 3",
      "a shorter sequence")
check(compare_tokens.verdict([], [["1"]]).startswith("tokens not compared"), "a log without tokens")
check(compare_tokens.verdict([["1"]], [["1"], ["2"]]).startswith("tokens not compared"), "different batches")
missing = subprocess.run([sys.executable, str(SCRIPT), "/nonexistent/new.log", "/nonexistent/old.log"],
                         capture_output=True, text=True)
check(missing.returncode == 2 and "No such file" in missing.stderr, f"a missing log: {missing.stderr!r}")
print("compare_tokens: all checks passed")
