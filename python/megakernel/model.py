"""megakernel.Model: a LLaMA-family model run by mk's engines on numpy arrays and torch tensors (CPU or CUDA)."""

from __future__ import annotations

import json
import os
import reprlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Union

import numpy as np

from . import _core
from ._arguments import INT64, UINT64, checked_engine, checked_int, checked_name, checked_path, made_by_the_core
from ._generation import Prompt, generate_ids, run_stream
from .tokenizer import Tokenizer

# A model's input: token ids (batch, seq_len) as int32/int64, or hidden states (batch, seq_len, d_model) for models
# without an embedding; a numpy array (or anything np.asarray takes) or a torch tensor.
ArrayLike = Any
Engine = str  # "auto" | "gpu" | "cpu-vm" | "reference"
# What generate() returns: the new text or ids of one prompt, or a list of them for a batch of prompts.
Generated = Union[str, list[int], list[str], list[list[int]]]


def _torch_tensor(value: Any) -> Any:
    """`value` when it is a torch tensor (torch imported by whoever made it), else None; never imports torch."""
    torch = sys.modules.get("torch")
    return value if torch is not None and isinstance(value, torch.Tensor) else None


class Model:
    """A LLaMA-family model: its weights (bf16) on the host, its tokenizer when the model directory has one, and the
    engines built for it so far (one per engine and shape, so that repeated calls reuse schedules and, on the GPU,
    the uploaded weights; the gpu engine of the last shape only, as each holds its own copy of the weights).

    Create one with Model.from_pretrained(dir) or Model.preset(name)."""

    def __init__(self, core: _core.Model) -> None:
        self._core = made_by_the_core(core, _core.Model, "Model",
                                      "Model.from_pretrained(directory) or Model.preset(name)")
        self._tokenizer = Tokenizer(core.tokenizer) if core.tokenizer is not None else None
        self._config: dict[str, Any] = json.loads(core.config_json())

    # ---- construction ----

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str]) -> Model:
        """Loads a model directory: config.json (Hugging Face LlamaForCausalLM) or mk_config.json (mk's own form, for
        models Hugging Face cannot describe), model.safetensors or sharded safetensors, and tokenizer.json (with its
        config files) when present."""
        core = _core.Model.from_dir(checked_path(directory, "directory"))
        if core.load_warning:  # transformers loads such a checkpoint with a warning too
            warnings.warn(core.load_warning, stacklevel=2)
        return cls(core)

    @classmethod
    def preset(
        cls,
        name: str,
        seed: int = 1,
        *,
        layers: int | None = None,
        d_model: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
        d_ff: int | None = None,
    ) -> Model:
        """A built-in model ("seed", "tiny", "llama-3.2-1b", "llama-3.1-8b"; see megakernel.presets()) with random
        weights of `seed`: the weights `mk run --preset NAME --seed SEED` runs. The shape overrides are mk's
        --layers, --d-model (which also sets heads = d_model / head_dim and d_ff = 4 d_model), --heads, --kv-heads
        and --d-ff."""
        sizes = {"layers": layers, "d_model": d_model, "heads": heads, "kv_heads": kv_heads, "d_ff": d_ff}
        checked = [0 if size is None else checked_int(size, key, INT64) for key, size in sizes.items()]
        return cls(_core.Model.from_preset(checked_name(name, "name"), checked_int(seed, "seed", UINT64), *checked))

    # ---- what the model is ----

    @property
    def config(self) -> dict[str, Any]:
        """The model's config in mk's JSON form (the "config" of `mk info --json`)."""
        return dict(self._config)

    @property
    def name(self) -> str:
        return str(self._config["name"])

    @property
    def has_embedding(self) -> bool:
        """False for models that take hidden states (batch, seq_len, d_model) instead of token ids (the seed's)."""
        return bool(self._config["has_embedding"])

    @property
    def has_lm_head(self) -> bool:
        """False for models whose output is the final hidden states instead of logits (the seed's)."""
        return bool(self._config["has_lm_head"])

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer.json of the model directory, or None (presets have none)."""
        return self._tokenizer

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end generation: generation_config.json's or config.json's eos_token_id, else the
        tokenizer's; empty when none says."""
        return list(self._core.eos_ids)

    def info(self, batch: int | None = None, seq_len: int | None = None) -> dict[str, Any]:
        """What `mk info --json` prints for this model and a forward pass of batch x seq_len tokens (default: the
        preset's shape, or 1 x 128): config, shape, parameters, FLOPs, minimum bytes, weight and activation bytes."""
        default_batch, default_seq = self._core.default_shape
        batch = default_batch if batch is None else checked_int(batch, "batch", INT64)
        seq_len = default_seq if seq_len is None else checked_int(seq_len, "seq_len", INT64)
        return json.loads(self._core.info_json(batch, seq_len))

    def __repr__(self) -> str:
        return f"Model({self.name!r}, source={self._core.source!r})"

    # ---- text ----

    def _require_tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise _core.MkError(f"model '{self.name}' ({self._core.source}) has no tokenizer.json")
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` with the model's tokenizer (BOS added as the tokenizer's post-processor says)."""
        return self._require_tokenizer().encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int] | ArrayLike, skip_special_tokens: bool = False) -> str:
        """The text of token ids with the model's tokenizer."""
        return self._require_tokenizer().decode(ids, skip_special_tokens)

    # ---- forward passes ----

    def forward(self, tokens: ArrayLike, engine: Engine = "auto") -> ArrayLike:
        """One forward pass over `tokens` (batch, seq_len), int32 or int64 ids, or hidden states
        (batch, seq_len, d_model) for models without an embedding. Returns logits (batch, seq_len, vocab_size), or
        the final hidden states (batch, seq_len, d_model) for models without an LM head.

        A numpy array (or a nested list) gives a float32 numpy array. A torch tensor gives a torch tensor on the same
        device: float32, except from the gpu engine on a CUDA tensor, where the pass runs on the device's own
        tensors through DLPack with no copy through the host and the result is the megakernel's bfloat16 output as
        it is (`.float()` converts it exactly).

        engine: "gpu" (the megakernel, Hopper only), "cpu-vm" (the same schedule on CPU threads, bit-identical to
        the reference), "reference" (fp32 op by op), or "auto": the gpu engine where a usable GPU exists, else the
        reference. Raises MkError with mk's message for a bad shape, dtype, token id or engine."""
        kind = _core.resolve_engine(checked_engine(engine))
        tensor = _torch_tensor(tokens)
        if tensor is None:
            return self._core.forward(kind, self._host_array(tokens))
        torch = sys.modules["torch"]
        if tensor.is_cuda and kind == "gpu":
            return self._forward_device(tensor)
        output = torch.from_numpy(self._core.forward(kind, self._host_array(tensor)))
        return output if tensor.device.type == "cpu" else output.to(tensor.device)

    __call__ = forward

    def trace(self, tokens: ArrayLike, path: str | os.PathLike[str], engine: Engine = "auto") -> str:
        """One traced forward pass over `tokens` on the gpu engine or the cpu-vm ("auto": the gpu where usable, else
        the cpu-vm): writes the per-SM timeline as Chrome trace JSON to `path` (open it at ui.perfetto.dev) and
        returns the summary `mk trace` prints (per-op time, per-SM busy/waiting/idle, longest waits)."""
        return self._core.trace(checked_engine(engine), self._host_array(tokens), checked_path(path, "path"))

    def clear_engines(self) -> None:
        """Frees every cached engine (the gpu engine's device memory with it) and the cached decoder."""
        self._core.clear_engines()

    def _host_array(self, value: ArrayLike) -> np.ndarray:
        """`value` as a C-contiguous numpy array the core takes: ids as they are (the core checks their dtype),
        floating-point hidden states as float32."""
        tensor = _torch_tensor(value)
        if tensor is not None:
            tensor = tensor.detach().cpu()
            if tensor.is_floating_point():
                tensor = tensor.float()
            return tensor.contiguous().numpy()
        try:
            array = np.ascontiguousarray(value)
        except (TypeError, ValueError):  # a ragged nesting, say
            array = None
        # None, text or a dict become arrays of objects or strings, which the core's binding refuses with a TypeError
        # naming no argument.
        if array is None or array.dtype.kind not in "biufc":
            if self.has_embedding:
                expected = "token ids (batch, seq_len), int32 or int64"
            else:
                expected = f"hidden states (batch, seq_len, {self._config['d_model']}), float32"
            raise _core.MkError(f"tokens must be {expected}, got {reprlib.repr(value)}")
        if not self.has_embedding and array.dtype.kind == "f":
            array = np.ascontiguousarray(array, dtype=np.float32)
        return array

    def _forward_device(self, tensor: Any) -> Any:
        """The gpu engine on a CUDA tensor: ids (or hidden states) converted on the device, copied device to device
        into the engine's input, the output copied device to device into a new tensor."""
        torch = sys.modules["torch"]
        batch, seq_len = self._core.input_shape(list(tensor.shape))
        data = tensor.detach()
        if self.has_embedding and data.dtype in (torch.int32, torch.int64):
            self._check_token_range(data)
            data = data.to(torch.int32)
        elif not self.has_embedding and data.is_floating_point():
            data = data.to(torch.bfloat16)
        data = data.contiguous()
        output = torch.empty((batch, seq_len, self._core.output_cols), dtype=torch.bfloat16, device=tensor.device)
        # The engine runs on its own stream: what torch's current stream queued for the input must be done first.
        torch.cuda.current_stream(tensor.device).synchronize()
        self._core.forward_device(data, output)
        return output

    def _check_token_range(self, ids: Any) -> None:
        """The host engines' check of token ids, done on the device (only a flag and, on failure, one id come back)."""
        vocab = int(self._config["vocab_size"])
        bad = ((ids < 0) | (ids >= vocab)).flatten()
        if bool(bad.any()):
            position = int(bad.nonzero()[0])
            value = int(ids.flatten()[position])
            raise _core.MkError(f"token id {value} at position {position} is outside the vocabulary [0, {vocab})")

    # ---- generation ----

    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        eos_ids: Sequence[int] | None = None,
        engine: Engine = "auto",
        max_context: int | None = None,
        skip_special_tokens: bool = True,
    ) -> Generated:
        """Generates up to max_new_tokens tokens after each prompt: a prefill pass over the prompt, then one decode step
        per token, until an EOS id, the budget or the KV cache's end. Returns only the new part: text for a text
        prompt (decoded with skip_special_tokens, so the EOS does not show), ids for ids (the EOS that ended the
        sequence included, as `mk generate` prints it); a list of prompts (texts, or
        lists or a 2-D array of ids) gives a list of results, generated as one batch.

        temperature 0 is greedy; else tokens are drawn from softmax(logits / temperature) cut to top_k (0: all) and
        top_p, with random numbers from `seed` (the same on every engine and run). eos_ids: default the model's
        (Model.eos_ids). engine: "auto" is the gpu engine where a usable GPU exists, else the cpu-vm; or "gpu",
        "cpu-vm", "reference".
        max_context: KV cache positions per sequence (default: longest prompt + max_new_tokens, in whole blocks)."""
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_ids=eos_ids,
                       engine=engine, max_context=max_context)
        return generate_ids(self, prompt, max_new_tokens, options, skip_special_tokens)

    def stream(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 16,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        eos_ids: Sequence[int] | None = None,
        engine: Engine = "auto",
        max_context: int | None = None,
        skip_special_tokens: bool = True,
    ) -> Iterator[str | int]:
        """generate() for one prompt, as an iterator over what each decode step makes as it makes it: pieces of text
        (whole UTF-8 characters; a token that ends inside a character shows with the one that completes it) for a
        text prompt, ids for an ids prompt. Stopping the iteration early stops the generation at the next step. The
        arguments are checked when it is called, by generate()'s checks: a bad one raises MkError there, not at
        next()."""
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_ids=eos_ids,
                       engine=engine, max_context=max_context)
        return run_stream(self, prompt, max_new_tokens, options, skip_special_tokens)
