"""The seed blog's model in PyTorch, and what mk needs to run the same weights on the same input."""
import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

RMS_EPS = 1e-6  # the seed preset's


class Block(torch.nn.Module):
    """The seed blog's LLaMA-like block: no RoPE, fused QKV, causal attention, SwiGLU MLP."""

    def __init__(self, dim, heads, ffn):
        super().__init__()
        factory = {"device": "cuda", "dtype": torch.bfloat16}
        self.heads = heads
        self.attn_norm = torch.nn.Parameter(torch.empty(dim, **factory))
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False, **factory)
        self.out = torch.nn.Linear(dim, dim, bias=False, **factory)
        self.mlp_norm = torch.nn.Parameter(torch.empty(dim, **factory))
        self.gate = torch.nn.Linear(dim, ffn, bias=False, **factory)
        self.up = torch.nn.Linear(dim, ffn, bias=False, **factory)
        self.down = torch.nn.Linear(ffn, dim, bias=False, **factory)

    def forward(self, x):
        batch, seq, dim = x.shape
        h = F.rms_norm(x, (dim,), self.attn_norm, RMS_EPS)
        q, k, v = self.qkv(h).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, seq, dim))
        h = F.rms_norm(x, (dim,), self.mlp_norm, RMS_EPS)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Stack(torch.nn.Module):
    def __init__(self, dim, heads, ffn, layers):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        with torch.no_grad():
            for parameter in self.parameters():
                # Same distribution as mk's random weights: norm weights away from one, matrices N(0, 0.02).
                if parameter.ndim == 1:
                    parameter.uniform_(0.5, 1.5)
                else:
                    parameter.normal_(0.0, 0.02)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def hf_tensors(model):
    """The stack's weights under Hugging Face Llama names, q/k/v split from the fused projection."""
    tensors = {}
    for index, block in enumerate(model.blocks):
        prefix = f"model.layers.{index}."
        q, k, v = block.qkv.weight.detach().chunk(3, dim=0)  # (dim, dim) each: rows are heads side by side
        for name, weight in (("input_layernorm", block.attn_norm), ("post_attention_layernorm", block.mlp_norm),
                             ("self_attn.q_proj", q), ("self_attn.k_proj", k), ("self_attn.v_proj", v),
                             ("self_attn.o_proj", block.out.weight), ("mlp.gate_proj", block.gate.weight),
                             ("mlp.up_proj", block.up.weight), ("mlp.down_proj", block.down.weight)):
            tensors[prefix + name + ".weight"] = weight.detach().to(torch.bfloat16).contiguous().cpu()
    return tensors


def export_for_mk(model, mk_config, directory: Path):
    """mk_config.json (the config mk itself describes for this shape) and model.safetensors of the stack's weights."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "mk_config.json").write_text(json.dumps(mk_config) + "\n")
    save_file(hf_tensors(model), str(directory / "model.safetensors"))


def save_hidden(x, path: Path):
    """The input as mk's `--input` takes it: `hidden` (batch, seq, d_model)."""
    save_file({"hidden": x.detach().float().contiguous().cpu()}, str(path))


def reference_fp32(model, x):
    """The same stack in fp32 on the same (bf16) weights and input: the yardstick of the tolerance policy."""
    exact = copy.deepcopy(model).float()
    with torch.no_grad():
        out = exact(x.float())
    del exact
    return out
