"""Benchmarks the mk megakernel against PyTorch (eager, CUDA graph, torch.compile) on the seed blog's three sweeps."""
import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

# cfg = (batch, seq, d_model, heads, ffn, layers); heads = d_model / 128 and ffn = 4 d_model, as in the seed blog.
SWEEPS = {
    "seq": [(8, seq, 1024, 8, 4096, 8) for seq in (256, 512, 1024, 2048, 4096)],
    "layers": [(8, 256, 1024, 8, 4096, layers) for layers in (1, 2, 4, 8, 16)],
    "embed": [(8, 256, dim, dim // 128, 4 * dim, 1) for dim in (1024, 1280, 2048, 3072, 4096)],
}
BACKENDS = ("eager", "eager+graph", "inductor", "inductor-max+graph")
SLOW_BACKEND = "inductor-max+graph"  # minutes of autotuning per config
RMS_EPS = 1e-6  # the seed preset's
INPUTS = 3  # timed runs rotate over this many inputs, so no run reads the previous run's input from L2
WARMUP_CALLS = 4  # the first call compiles; cudagraph trees need two more before they replay
MAX_DEVIATION = 5e-2  # relative to the change the stack makes to its input; a broken backend is off by ~1
FLOPS_AGREEMENT = 1e-9  # mk run and mk info report the same count
ERROR_CHARS = 2000


class Fatal(Exception):
    """The benchmark cannot run at all (exit status 2)."""


class BenchError(Exception):
    """One measurement that failed; recorded, and the run goes on."""


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


def mk_shape_args(cfg):
    """The seed preset with the config's shape: the model both mk info and mk run describe."""
    batch, seq, dim, _, _, layers = cfg
    return ["--preset", "seed", "--batch", str(batch), "--seq", str(seq), "--d-model", str(dim), "--layers",
            str(layers)]


def mk_flops(mk, cfg):
    """FLOPs of the config as mk's graph counts them (`mk info --json`; causal attention counted half)."""
    batch, seq, dim, heads, ffn, layers = cfg
    command = [str(mk), "info", *mk_shape_args(cfg), "--json"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        info = json.loads(result.stdout) if result.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        raise Fatal(f"{' '.join(command)} failed: {error}") from None
    if info is None:
        raise Fatal(f"{' '.join(command)} exited with status {result.returncode}\n{tail(result.stderr)}")
    config = info["config"]
    described = (info["batch"], info["seq_len"], config["d_model"], config["n_heads"], config["d_ff"],
                 config["n_layers"])
    if described != (batch, seq, dim, heads, ffn, layers):
        raise Fatal(f"mk info describes {described}, not the requested {cfg}")
    return info["flops"]


def label(cfg):
    return "B{} S{} D{} H{} F{} L{}".format(*cfg)


def time_calls(run, count, iterations):
    """Median ms of single calls, cycling over `count` inputs."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    torch.cuda.synchronize()
    for i in range(iterations):
        starts[i].record()
        run(i % count)
        ends[i].record()
        # Each call starts on an idle GPU, so launch overhead counts, as it does for one mk launch.
        ends[i].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends))


def graph_runner(model, inputs):
    """Eager model replayed from CUDA graphs, one per input: copying inputs into one graph would add to the time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture needs warmed-up kernels and library handles, made off the default stream
        for x in inputs:
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outputs = [], []
    for x in inputs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(model(x))
        graphs.append(graph)

    def run(i):
        graphs[i].replay()
        return outputs[i]

    return run


def make_runner(backend, model, inputs):
    if backend == "eager":
        return lambda i: model(inputs[i])
    if backend == "eager+graph":
        return graph_runner(model, inputs)
    # Every config is a new model: without a reset, dynamo's recompile limit would silently fall back to eager.
    torch._dynamo.reset()
    if backend == "inductor":
        compiled = torch.compile(model)
        return lambda i: compiled(inputs[i])
    compiled = torch.compile(model, mode="max-autotune")

    def run(i):
        torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous replay are never read again
        return compiled(inputs[i])

    return run


def deviation(output, reference, x):
    """Distance from eager, relative to how far the stack moves its input (the input itself would hide errors)."""
    change = (reference.float() - x.float()).norm()
    return ((output.float() - reference.float()).norm() / change).item()


def bench_backend(backend, model, inputs, reference, iterations, flops):
    start = time.perf_counter()
    with torch.no_grad():
        run = make_runner(backend, model, inputs)
        for i in range(WARMUP_CALLS):
            run(i % len(inputs))
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - start
        off = deviation(run(0), reference, inputs[0])
        if not off <= MAX_DEVIATION:  # written so that NaN fails too
            raise BenchError(f"output deviates from eager by {off:.3g} (allowed {MAX_DEVIATION})")
        ms = time_calls(run, len(inputs), iterations)
    return {"ms": ms, "tflops": flops / ms / 1e9, "setup_s": setup_s, "deviation_from_eager": off}


def release():
    torch._dynamo.reset()  # also drops compiled graphs and cudagraph pools that hold GPU memory
    gc.collect()
    torch.cuda.empty_cache()


def bench_torch(cfg, backends, iterations, flops):
    batch, seq, dim, heads, ffn, layers = cfg
    results = {}
    try:
        torch.manual_seed(0)
        model = Stack(dim, heads, ffn, layers)
        inputs = [torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(INPUTS)]
        with torch.no_grad():
            reference = model(inputs[0])
    except Exception as error:  # e.g. out of memory: every backend of this config fails the same way
        message = f"building the model failed: {type(error).__name__}: {error}"[:ERROR_CHARS]
        print(f"   torch: {message[:300]}", flush=True)
        return {backend: {"error": message} for backend in backends}
    for backend in backends:
        try:
            results[backend] = bench_backend(backend, model, inputs, reference, iterations, flops)
            result = results[backend]
            print(f"   {backend:<19} {result['ms']:9.3f} ms {result['tflops']:7.1f} TFLOP/s   "
                  f"(setup {result['setup_s']:.1f} s, deviation from eager {result['deviation_from_eager']:.1e})",
                  flush=True)
        except Exception as error:  # a compile error or OOM in one backend must not lose the others
            results[backend] = {"error": f"{type(error).__name__}: {error}"[:ERROR_CHARS]}
            print(f"   {backend:<19} FAILED: {results[backend]['error'][:300]}", flush=True)
        release()
    return results


def tail(text, lines=20):
    return "\n".join(text.strip().splitlines()[-lines:])


def brief(message):
    """First and last line: for an mk failure, the command and mk's own error message."""
    lines = message.strip().splitlines() or [""]
    return lines[0][:300] + (f" ... {lines[-1][:300]}" if len(lines) > 1 else "")


def run_mk(mk, cfg, out_dir, iterations, timeout, flops):
    batch, seq, dim, heads, ffn, layers = cfg
    path = out_dir / f"mk_b{batch}_s{seq}_d{dim}_l{layers}.json"
    path.unlink(missing_ok=True)  # a stale file must not pass for this run's result
    command = [str(mk), "run", *mk_shape_args(cfg), "--engine", "gpu", "--iterations", str(iterations), "--json",
               str(path)]
    start = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"mk timed out after {timeout} s: {' '.join(command)}") from None
    wall_s = time.perf_counter() - start
    if result.returncode != 0:
        raise BenchError(f"mk exited with status {result.returncode}: {' '.join(command)}\n"
                         f"{tail(result.stderr + result.stdout)}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BenchError(f"mk exited 0 but {path} is unreadable: {error}") from None
    shape = {"batch": batch, "seq_len": seq, "d_model": dim, "n_heads": heads, "d_ff": ffn, "n_layers": layers}
    wrong = {key: data.get(key) for key, value in shape.items() if data.get(key) != value}
    if wrong or data.get("engine") != "gpu":
        raise BenchError(f"mk ran engine {data.get('engine')} with {wrong}, not the requested {shape}")
    if abs(data["flops"] - flops) > FLOPS_AGREEMENT * flops:
        raise BenchError(f"mk run counts {data['flops']:.6e} FLOPs, mk info {flops:.6e}: not the same model")
    return {"ms": data["ms"], "tflops": data["tflops"], "flops": data["flops"], "wall_s": wall_s}


def measure_ceilings(iterations):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    for _ in range(3):
        a @ b
        dst.copy_(src)
    matmul_ms = time_calls(lambda _: a @ b, 1, iterations)
    copy_ms = time_calls(lambda _: dst.copy_(src), 1, iterations)
    ceilings = {"cublas_bf16_8192_tflops": 2 * n**3 / matmul_ms / 1e9,
                "d2d_copy_gbps": 2 * src.numel() / copy_ms / 1e6}  # each byte is read once and written once
    del a, b, src, dst
    release()
    return ceilings


def git_commit(repo):
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def plan(sweeps, backends, max_autotune_all):
    """Each distinct config once (the sweeps share some), with every backend any sweep wants for it."""
    jobs = {}
    for sweep in sweeps:
        for index, cfg in enumerate(SWEEPS[sweep]):
            wanted = jobs.setdefault(cfg, set())
            wanted.update(b for b in backends if b != SLOW_BACKEND or index == 0 or max_autotune_all)
    return {cfg: [b for b in backends if b in wanted] for cfg, wanted in jobs.items()}


def summarize(record):
    measured = {name: r["ms"] for name, r in record["torch"].items() if "ms" in r}
    record["best_torch"] = min(measured, key=measured.get) if measured else None
    record["best_torch_ms"] = measured[record["best_torch"]] if measured else None
    mk_ms = record["mk"].get("ms")
    record["speedup"] = record["best_torch_ms"] / mk_ms if measured and mk_ms else None


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def build_report(meta, ceilings, records, sweeps):
    report = {"meta": meta, "ceilings": ceilings, "configs": list(records.values()), "sweeps": {}}
    for sweep in sweeps:
        done = [cfg for cfg in SWEEPS[sweep] if cfg in records]
        speedups = [records[cfg]["speedup"] for cfg in done if records[cfg]["speedup"]]
        report["sweeps"][sweep] = {"configs": [label(cfg) for cfg in done], "geomean_speedup": geomean(speedups),
                                   "configs_with_speedup": len(speedups), "configs_planned": len(SWEEPS[sweep])}
    return report


def markdown(report, backends):
    meta, ceilings = report["meta"], report["ceilings"]
    by_label = {record["label"]: record for record in report["configs"]}
    lines = [
        "# mk megakernel vs PyTorch",
        "",
        f"{meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']}), commit {meta['commit']}, {meta['date']}.",
        f"Ceilings: cuBLAS bf16 8192^3 matmul {ceilings['cublas_bf16_8192_tflops']:.0f} TFLOP/s, "
        f"device-to-device copy {ceilings['d2d_copy_gbps']:.0f} GB/s (read + write).",
        f"Times: median of {meta['iterations']} runs; cells are ms (TFLOP/s); speedup = best torch ms / mk ms; "
        f"'-' not run, ERR failed (see bench.json).",
    ]
    header = ["config", "mk ms", "mk TFLOP/s"] + list(backends) + ["best torch", "speedup"]
    for sweep, summary in report["sweeps"].items():
        lines += ["", f"## {sweep} sweep", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        for name in summary["configs"]:
            record = by_label[name]
            mk = record["mk"]
            cells = [name, f"{mk['ms']:.3f}" if "ms" in mk else "ERR", f"{mk['tflops']:.1f}" if "ms" in mk else "ERR"]
            for backend in backends:
                result = record["torch"].get(backend)
                cells.append("-" if result is None else "ERR" if "error" in result
                             else f"{result['ms']:.3f} ({result['tflops']:.0f})")
            cells.append(record["best_torch"] or "-")
            cells.append(f"{record['speedup']:.2f}x" if record["speedup"] else "-")
            lines.append("| " + " | ".join(cells) + " |")
        mean = summary["geomean_speedup"]
        lines += ["", f"Geometric mean speedup: {f'{mean:.2f}x' if mean else '-'} over "
                      f"{summary['configs_with_speedup']} of {summary['configs_planned']} configs."]
    return "\n".join(lines) + "\n"


def write_outputs(out_dir, report, backends):
    (out_dir / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report, backends)
    (out_dir / "bench.md").write_text(text)
    return text


def parse_list(parser, option, text, known):
    items = [item for item in text.split(",") if item]
    unknown = [item for item in items if item not in known]
    if unknown or not items:
        parser.error(f"{option}: unknown or empty {unknown} (known: {', '.join(known)})")
    return items


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mk", required=True, type=Path, help="the mk binary")
    parser.add_argument("--out", required=True, type=Path, help="directory for bench.json, bench.md and mk's JSON")
    parser.add_argument("--sweeps", default=",".join(SWEEPS), help="comma-separated, of " + ", ".join(SWEEPS))
    parser.add_argument("--torch-backends", default=",".join(BACKENDS),
                        help="comma-separated, of " + ", ".join(BACKENDS))
    parser.add_argument("--max-autotune-all", action="store_true",
                        help=f"run {SLOW_BACKEND} on every config, not only the first of each sweep")
    parser.add_argument("--iterations", type=int, default=30, help="timed runs per measurement")
    parser.add_argument("--mk-timeout", type=int, default=300, help="seconds allowed per mk run")
    args = parser.parse_args()
    args.sweeps = parse_list(parser, "--sweeps", args.sweeps, list(SWEEPS))
    args.torch_backends = parse_list(parser, "--torch-backends", args.torch_backends, BACKENDS)
    if args.iterations < 1:
        parser.error("--iterations must be positive")
    return args


def main():
    args = parse_args()
    started = time.perf_counter()
    mk = args.mk.resolve()
    if not mk.is_file() or not os.access(mk, os.X_OK):
        raise Fatal(f"--mk {args.mk}: not an executable file")
    if not torch.cuda.is_available():
        raise Fatal("CUDA is not available to torch")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(Path(__file__).resolve().parent.parent), "mk": str(mk),
            "iterations": args.iterations, "inputs_rotated": INPUTS, "max_autotune_all": args.max_autotune_all}
    print(f"{meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, commit {meta['commit']}, {meta['date']}",
          flush=True)
    ceilings = measure_ceilings(args.iterations)
    print(f"ceilings: cuBLAS bf16 8192^3 {ceilings['cublas_bf16_8192_tflops']:.0f} TFLOP/s, "
          f"D2D copy {ceilings['d2d_copy_gbps']:.0f} GB/s", flush=True)

    jobs = plan(args.sweeps, args.torch_backends, args.max_autotune_all)
    records = {}
    for number, (cfg, backends) in enumerate(jobs.items(), 1):
        flops = mk_flops(mk, cfg)
        print(f"== [{number}/{len(jobs)}] {label(cfg)}: {flops / 1e9:.1f} GFLOP "
              f"({time.perf_counter() - started:.0f} s elapsed)", flush=True)
        record = {"config": list(cfg), "label": label(cfg), "flops": flops}
        try:
            record["mk"] = run_mk(mk, cfg, args.out, args.iterations, args.mk_timeout, flops)
            mk_result = record["mk"]
            print(f"   {'mk':<19} {mk_result['ms']:9.3f} ms {mk_result['tflops']:7.1f} TFLOP/s   "
                  f"(mk run {mk_result['wall_s']:.1f} s)", flush=True)
        except BenchError as error:
            record["mk"] = {"error": str(error)[:ERROR_CHARS]}
            print(f"   mk FAILED: {error}", flush=True)
        record["torch"] = bench_torch(cfg, backends, args.iterations, flops)
        release()
        summarize(record)
        records[cfg] = record
        # Rewritten after every config, so a run cut short by a time limit still leaves its results.
        text = write_outputs(args.out, build_report(meta, ceilings, records, args.sweeps), args.torch_backends)

    print("\n" + text)
    problems = [f"{record['label']} mk: {record['mk']['error']}" for record in records.values()
                if "error" in record["mk"]]
    problems += [f"{record['label']} {backend}: {result['error']}" for record in records.values()
                 for backend, result in record["torch"].items() if "error" in result]
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.md'} in {time.perf_counter() - started:.0f} s")
    if problems:
        print(f"bench: {len(problems)} measurement(s) FAILED:")
        for problem in problems:
            print("  " + brief(problem))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fatal as error:
        print(f"bench: error: {error}", file=sys.stderr)
        sys.exit(2)
