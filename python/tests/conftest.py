"""Fixtures of the Python package's tests: the mk CLI to compare with, safetensors files written and read without mk's
own code, scratch directories, and the `gpu` marker."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FIXTURES = REPO / "tests" / "data" / "tokenizers"

_DTYPES = {"I32": np.int32, "I64": np.int64, "F32": np.float32}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a usable Hopper GPU and torch with CUDA (skipped elsewhere)")


@pytest.fixture(scope="session")
def mk_binary() -> str:
    """The mk CLI: $MK_BINARY (ctest sets it to the build's), else the one `pip install .` put on PATH."""
    binary = os.environ.get("MK_BINARY") or shutil.which("mk")
    if not binary:
        pytest.fail("no mk binary: set MK_BINARY or install the package (pip install .), which installs mk")
    return binary


@pytest.fixture(scope="session")
def run_mk(mk_binary: str):
    """Runs `mk ARGS...`; returns its stdout, failing the test with its output when it exits non-zero."""

    def run(*args: Any) -> str:
        result = subprocess.run([mk_binary, *map(str, args)], capture_output=True, text=True)
        assert result.returncode == 0, f"mk {' '.join(map(str, args))} failed:\n{result.stdout}{result.stderr}"
        return result.stdout

    return run


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of `tensors` (I32, I64 or F32), written here rather than by mk."""
    names = {np.dtype(v): k for k, v in _DTYPES.items()}
    header: dict[str, Any] = {}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (I32, I64 or F32)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    body = raw[8 + length :]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


@pytest.fixture
def mk_forward(run_mk, tmp_path: Path):
    """`mk run ... --input IN --output OUT` on an input array: the output (batch, seq, N) float32 as mk wrote it."""

    def forward(model_args: list[str], inputs: np.ndarray, engine: str = "reference") -> np.ndarray:
        name = "tokens" if inputs.dtype.kind == "i" else "hidden"
        write_safetensors(tmp_path / "in.safetensors", {name: inputs})
        run_mk("run", *model_args, "--engine", engine, "--input", tmp_path / "in.safetensors",
               "--output", tmp_path / "out.safetensors")
        (output,) = read_safetensors(tmp_path / "out.safetensors").values()
        return output

    return forward
