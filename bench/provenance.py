"""Where a benchmark's figures come from: the commit of the tree that was measured."""
import subprocess
from pathlib import Path


def git_commit(repo):
    """The commit of the tree at `repo`: its COMMIT file where scripts/gpu_snapshot.sh copied it out of git, else its
    git HEAD ("+dirty" with uncommitted changes), else "unknown" (never the HEAD of a checkout the copy sits in)."""
    stamp = repo / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo.resolve():
            return "unknown"
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
