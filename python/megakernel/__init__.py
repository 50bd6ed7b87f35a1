"""megakernel: a LLaMA-family forward pass as one persistent CUDA kernel on Hopper, from Python.

    import megakernel
    model = megakernel.Model.preset("tiny")             # or Model.from_pretrained("path/to/model")
    logits = model.forward(tokens)                      # tokens: torch tensor (CPU or CUDA) or numpy array

Engines: "gpu" (the megakernel, Hopper only), "cpu-vm" (the same schedule interpreted on CPU threads) and
"reference" (plain fp32, op by op); "auto" picks the gpu engine where a usable GPU exists, else the reference.
Every error from mk's C++ core is raised as MkError carrying mk's message.
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._core import MkError
from .model import Model
from .tokenizer import StreamDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = ["MkError", "Model", "StreamDecoder", "Tokenizer", "gpu_info", "presets", "__version__"]


def gpu_info() -> dict[str, Any]:
    """Whether the gpu engine can run here, and why not: usable, reason, name, sm_count, compute_capability,
    memory_bytes (of CUDA device 0)."""
    return _core.gpu_info()


def presets() -> list[dict[str, Any]]:
    """The built-in models: name, description, and the default batch and seq_len of each."""
    return _core.presets()
