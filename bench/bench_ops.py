#!/usr/bin/env python3
"""Per-op rates of the megakernel's tiles, read from its trace, against cuBLAS (the GEMMs) and PyTorch's SDPA
backends (causal attention) on the same shapes, in one process.

mk runs the whole forward pass once under `mk trace`. An op's in-situ rate is its FLOPs (`mk info`'s flops_by_op,
the benchmark's convention: causal attention counted half) over its tiles' math and epilogue time spread over the
SMs (`mk trace --summary`): what its tiles reach once fed, dependency and operand waits excluded.
PyTorch runs one layer's GEMM (F.linear, bf16) or causal SDPA alone, over rotated inputs (at the seed's shapes they
still fit L2, as mk's operands do), timed CALLS calls per event pair so that no launch gap counts. NOTE: this
compares tiles with kernels; bench/bench.py compares whole passes, waits included.

Usage: bench_ops.py --mk build/mk [--configs 'B8 S256 D1024 H8 F4096 L8;...'] [--engine gpu|cpu-vm] [--mk-only]
           [--out DIR] [--iterations 30]
"""
import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from provenance import git_commit

# cfg = (batch, seq, d_model, heads, ffn, layers) with heads = d_model / 128 and ffn = 4 d_model: the seed preset.
DEFAULT_CONFIGS = "B8 S256 D1024 H8 F4096 L8;B8 S4096 D1024 H8 F4096 L8;B8 S256 D3072 H24 F12288 L1"
ORDER = ("qkv", "attention", "o_proj", "gate_up", "down")  # a layer's ops with FLOPs, in program order
INPUTS = 3  # rotated between timed calls, as bench.py does
CALLS = 20  # per timed event pair: the GPU stays busy, so the host's dispatch of each call is hidden


class Fatal(Exception):
    """The benchmark cannot run (exit status 2)."""


def progress(message):
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def parse_config(label):
    match = re.fullmatch(r"B(\d+) S(\d+) D(\d+) H(\d+) F(\d+) L(\d+)", label.strip())
    if not match:
        raise Fatal(f"config '{label}': expected 'B<batch> S<seq> D<d_model> H<heads> F<ffn> L<layers>'")
    cfg = tuple(int(v) for v in match.groups())
    if cfg[3] * 128 != cfg[2] or cfg[4] != 4 * cfg[2]:
        raise Fatal(f"config '{label}': the seed preset has heads = d_model / 128 and ffn = 4 d_model")
    return cfg


def shape_args(cfg):
    batch, seq, dim, _, _, layers = cfg
    return ["--preset", "seed", "--batch", str(batch), "--seq", str(seq), "--d-model", str(dim), "--layers",
            str(layers)]


def run_mk(mk, args):
    result = subprocess.run([str(mk), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise Fatal(f"mk {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return result.stdout


def mk_rates(mk, cfg, engine):
    """{op: the tiles' TFLOP/s} for every op with FLOPs, from one traced forward pass."""
    info = json.loads(run_mk(mk, ["info", *shape_args(cfg), "--json"]))
    flops_by_op = info["flops_by_op"]
    if abs(sum(flops_by_op.values()) - info["flops"]) > 1e-9 * info["flops"]:
        raise Fatal("mk info: flops_by_op does not add up to flops")
    with tempfile.TemporaryDirectory() as work:
        trace, summary = Path(work) / "trace.json", Path(work) / "summary.json"
        run_mk(mk, ["trace", *shape_args(cfg), "--engine", engine, "--out", str(trace), "--summary", str(summary)])
        traced = json.loads(summary.read_text())
    ops = {op["name"]: op for op in traced["ops"]}
    rates = {}
    for op, flops in flops_by_op.items():
        if op not in ops:
            raise Fatal(f"mk trace has no row for {op}, which mk info gives {flops:.3g} FLOPs")
        spread_ns = (ops[op]["math_ns"] + ops[op]["epilogue_ns"]) / traced["sms"]
        rates[op] = flops / spread_ns / 1e3 if spread_ns > 0 else float("nan")
    return rates


def torch_rates(cfg, iterations):
    """{op: (what ran, TFLOP/s)} for one layer's GEMMs and its causal attention, alone, on this GPU."""
    import torch  # only here: --mk-only runs where PyTorch is not installed
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, seq, dim, heads, ffn, _ = cfg
    head_dim, tokens = dim // heads, batch * seq
    device, dtype = torch.device("cuda"), torch.bfloat16

    def median_ms(call, inputs):  # of one call
        for i in range(3):
            call(inputs[i % INPUTS])
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iterations):
            start.record()
            for i in range(CALLS):
                call(inputs[i % INPUTS])
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / CALLS)
        return sorted(times)[len(times) // 2]

    gemm_shapes = {"qkv": (dim, 3 * dim), "o_proj": (dim, dim), "gate_up": (dim, 2 * ffn), "down": (ffn, dim)}
    rates = {}
    for op, (k, n) in gemm_shapes.items():
        weight = torch.randn(n, k, device=device, dtype=dtype)
        inputs = [torch.randn(tokens, k, device=device, dtype=dtype) for _ in range(INPUTS)]
        ms = median_ms(lambda a: F.linear(a, weight), inputs)
        rates[op] = ("cuBLAS (F.linear)", 2 * tokens * n * k / ms / 1e9)
    qkv = [[torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype) for _ in range(3)]
           for _ in range(INPUTS)]
    attention_flops = 4 * batch * heads * seq * seq * head_dim / 2  # causal: half, as mk counts it
    best = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                ms = median_ms(lambda x: F.scaled_dot_product_attention(*x, is_causal=True), qkv)
        except RuntimeError:
            continue  # this backend does not take the shape here
        if best is None or ms < best[1]:
            best = (backend.name.lower(), ms)
    if best is not None:
        rates["attention"] = (f"SDPA {best[0]}", attention_flops / best[1] / 1e9)
    return rates


def finite_or_none(value):  # JSON has no NaN
    return value if math.isfinite(value) else None


def report(label, mk, torch_side):
    lines = [f"## {label}", "", "| op | mk tiles TFLOP/s | PyTorch alone | TFLOP/s | mk / PyTorch |",
             "|---|---|---|---|---|"]
    for op in sorted(mk, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER)):
        if op in torch_side:
            what, theirs = torch_side[op]
            lines.append(f"| {op} | {mk[op]:.1f} | {what} | {theirs:.1f} | {mk[op] / theirs:.2f} |")
        else:
            lines.append(f"| {op} | {mk[op]:.1f} | - | - | - |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mk", required=True, help="the mk binary")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="';'-separated config labels")
    parser.add_argument("--engine", choices=("gpu", "cpu-vm"), default="gpu",
                        help="cpu-vm only checks the plumbing: its rates mean nothing")
    parser.add_argument("--mk-only", action="store_true", help="no PyTorch side (where PyTorch is not installed)")
    parser.add_argument("--out", help="directory for bench_ops.json and bench_ops.md")
    parser.add_argument("--iterations", type=int, default=30, help="timed PyTorch runs per op")
    args = parser.parse_args()
    try:
        configs = [parse_config(label) for label in args.configs.split(";")]
        labels = [label.strip() for label in args.configs.split(";")]
        results, sections = [], []
        for label, cfg in zip(labels, configs):
            progress(f"{label}: mk trace ({args.engine})")
            mk = mk_rates(args.mk, cfg, args.engine)
            torch_side = {}
            if not args.mk_only:
                progress(f"{label}: PyTorch, each op alone")
                torch_side = torch_rates(cfg, args.iterations)
            results.append({"config": label, "mk": {op: finite_or_none(rate) for op, rate in mk.items()},
                            "pytorch": {op: {"kernel": what, "tflops": rate} for op, (what, rate) in
                                        torch_side.items()}})
            sections.append(report(label, mk, torch_side))
    except Fatal as error:
        print(f"bench_ops.py: {error}", file=sys.stderr)
        return 2
    text = "# mk's tiles against PyTorch's kernels, op by op\n\n" + "\n\n".join(sections) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"commit": git_commit(Path(__file__).resolve().parent.parent), "engine": args.engine,
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (out / "bench_ops.json").write_text(json.dumps({"meta": meta, "configs": results}, indent=1) + "\n")
        (out / "bench_ops.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
