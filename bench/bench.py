"""Benchmarks the mk megakernel against every PyTorch backend a user would pick (torch_backends.py) on the seed blog's
three sweeps, in one process, on the same weights and inputs; mk's output is checked against an fp32 computation
of the same model with the project's tolerance policy, so a fast wrong answer fails the benchmark."""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file

from provenance import git_commit
from seed_model import Stack, export_for_mk, reference_fp32, save_hidden
from torch_backends import BACKENDS, ERROR_CHARS, SLOW_BACKENDS, BenchError, bench_torch, deviation, release, time_calls

# cfg = (batch, seq, d_model, heads, ffn, layers); heads = d_model / 128 and ffn = 4 d_model, as in the seed blog.
SWEEPS = {
    "seq": [(8, seq, 1024, 8, 4096, 8) for seq in (256, 512, 1024, 2048, 4096)],
    "layers": [(8, 256, 1024, 8, 4096, layers) for layers in (1, 2, 4, 8, 16)],
    "embed": [(8, 256, dim, dim // 128, 4 * dim, 1) for dim in (1024, 1280, 2048, 3072, 4096)],
}
INPUTS = 3  # torch's timed runs rotate over this many inputs, so no run reads the previous run's input from L2
FLOPS_AGREEMENT = 1e-9  # mk run and mk info report the same count


class Fatal(Exception):
    """The benchmark cannot run at all (exit status 2)."""


def mk_shape_args(cfg):
    """The seed preset with the config's shape: the model mk info describes."""
    batch, seq, dim, _, _, layers = cfg
    return ["--preset", "seed", "--batch", str(batch), "--seq", str(seq), "--d-model", str(dim), "--layers",
            str(layers)]


def mk_info(mk, cfg):
    """mk's own description of the config (`mk info --json`): its config form and its FLOP count."""
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
    return info


def label(cfg):
    return "B{} S{} D{} H{} F{} L{}".format(*cfg)


def tail(text, lines=20):
    return "\n".join(text.strip().splitlines()[-lines:])


def brief(message):
    """First and last line: for an mk failure, the command and mk's own error message."""
    lines = message.strip().splitlines() or [""]
    return lines[0][:300] + (f" ... {lines[-1][:300]}" if len(lines) > 1 else "")


def run_mk(mk, work, iterations, timeout, flops):
    """mk on the model and input in `work`: its time, and its output read back."""
    path, output = work / "mk.json", work / "out.safetensors"
    command = [str(mk), "run", "--model", str(work / "model"), "--input", str(work / "in.safetensors"), "--output",
               str(output), "--engine", "gpu", "--iterations", str(iterations), "--json", str(path)]
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
        hidden = load_file(str(output))["hidden"]
    except (OSError, KeyError, json.JSONDecodeError) as error:
        raise BenchError(f"mk exited 0 but its results are unreadable: {error}") from None
    if data.get("engine") != "gpu":
        raise BenchError(f"mk ran engine {data.get('engine')}, not gpu")
    if abs(data["flops"] - flops) > FLOPS_AGREEMENT * flops:
        raise BenchError(f"mk run counts {data['flops']:.6e} FLOPs, mk info {flops:.6e}: not the same model")
    return {"ms": data["ms"], "tflops": data["tflops"], "flops": data["flops"], "wall_s": wall_s}, hidden


def check_mk_output(hidden, x, eager, exact):
    """The tolerance policy of docs/design.md, on the change the stack makes to its input: mk may err at most twice
    as much as PyTorch's own bf16 computation, plus one bf16 rounding of the output; NaN never passes."""
    mk_error = deviation(hidden.to(exact.device).view_as(exact), exact, x)
    torch_error = deviation(eager, exact, x)
    rounding = deviation(exact.to(torch.bfloat16), exact, x)
    allowed = 2 * torch_error + rounding
    check = {"mk_error": mk_error, "torch_bf16_error": torch_error, "allowed": allowed,
             "passed": bool(mk_error <= allowed)}  # written so that NaN fails
    if not check["passed"]:
        raise BenchError(f"mk's output is wrong: error {mk_error:.3e} against fp32 (PyTorch bf16 {torch_error:.3e}, "
                         f"allowed {allowed:.3e})")
    return check


def bench_config(mk, cfg, backends, args):
    """mk and every backend on one model and input set; returns the config's record."""
    batch, seq, dim, heads, ffn, layers = cfg
    info = mk_info(mk, cfg)
    flops = info["flops"]
    record = {"config": list(cfg), "label": label(cfg), "flops": flops, "torch": {}}
    torch.manual_seed(0)
    model = Stack(dim, heads, ffn, layers)
    inputs = [torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(INPUTS)]
    with torch.no_grad():
        eager = model(inputs[0])
    exact = reference_fp32(model, inputs[0])
    with tempfile.TemporaryDirectory(prefix="mk-bench-") as directory:
        work = Path(directory)
        export_for_mk(model, info["config"], work / "model")
        save_hidden(inputs[0], work / "in.safetensors")
        try:
            record["mk"], hidden = run_mk(mk, work, args.iterations, args.mk_timeout, flops)
            record["mk"]["check"] = check_mk_output(hidden, inputs[0], eager, exact)
            result = record["mk"]
            print(f"   {'mk':<26} {result['ms']:9.3f} ms {result['tflops']:7.1f} TFLOP/s   (error vs fp32 "
                  f"{result['check']['mk_error']:.2e}, allowed {result['check']['allowed']:.2e}; "
                  f"mk run {result['wall_s']:.1f} s)", flush=True)
        except BenchError as error:
            record["mk"] = {"error": str(error)[:ERROR_CHARS]}
            print(f"   mk FAILED: {error}", flush=True)
    del exact
    record["torch"] = bench_torch(model, inputs, eager, backends, args.iterations, flops)
    del model, inputs, eager
    release()
    summarize(record)
    return record


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


def plan(sweeps, backends, slow_everywhere):
    """Each distinct config once (the sweeps share some), with every backend any sweep wants for it; the slow
    (autotuning) backends on the first config of each sweep unless asked for everywhere."""
    jobs = {}
    for sweep in sweeps:
        for index, cfg in enumerate(SWEEPS[sweep]):
            wanted = jobs.setdefault(cfg, set())
            wanted.update(b for b in backends if b not in SLOW_BACKENDS or index == 0 or slow_everywhere)
    return {cfg: [b for b in backends if b in wanted] for cfg, wanted in jobs.items()}


def summarize(record):
    measured = {name: r["ms"] for name, r in record["torch"].items() if "ms" in r}
    record["best_torch"] = min(measured, key=measured.get) if measured else None
    record["best_torch_ms"] = measured[record["best_torch"]] if measured else None
    mk_ms = record["mk"].get("ms")
    record["speedup"] = record["best_torch_ms"] / mk_ms if measured and mk_ms else None


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def overall(records):
    """Over the run's distinct configs (sweeps share some): the speedups' range and geometric mean, and how many are
    at or above 1.0x, the figures the prefill issue's targets are stated in."""
    speedups = [record["speedup"] for record in records.values() if record["speedup"]]
    return {"configs": len(records), "configs_with_speedup": len(speedups), "geomean_speedup": geomean(speedups),
            "min_speedup": min(speedups, default=None), "max_speedup": max(speedups, default=None),
            "configs_at_or_above_1": sum(speedup >= 1.0 for speedup in speedups)}


def build_report(meta, ceilings, records, sweeps):
    report = {"meta": meta, "ceilings": ceilings, "configs": list(records.values()), "sweeps": {},
              "overall": overall(records)}
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
        f"'-' not run, ERR failed (see bench.json). mk's error: its output against fp32 on the same weights and "
        f"input, relative to the change the stack makes, and the bound it must meet (twice PyTorch bf16's, plus one "
        f"bf16 rounding).",
    ]
    header = ["config", "mk ms", "mk TFLOP/s", "mk error vs fp32"] + list(backends) + ["best torch", "speedup"]
    for sweep, summary in report["sweeps"].items():
        lines += ["", f"## {sweep} sweep", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        for name in summary["configs"]:
            record = by_label[name]
            mk = record["mk"]
            check = mk.get("check")
            cells = [name, f"{mk['ms']:.3f}" if "ms" in mk else "ERR", f"{mk['tflops']:.1f}" if "ms" in mk else "ERR",
                     f"{check['mk_error']:.1e} <= {check['allowed']:.1e}" if check else "ERR"]
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
    total = report["overall"]
    if total["configs_with_speedup"]:
        lines += ["", "## All distinct configs", "",
                  f"{total['configs_with_speedup']} of {total['configs']} with a speedup: "
                  f"{total['min_speedup']:.2f}x-{total['max_speedup']:.2f}x, geometric mean "
                  f"{total['geomean_speedup']:.2f}x; at or above 1.0x on {total['configs_at_or_above_1']}."]
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
    parser.add_argument("--out", required=True, type=Path, help="directory for bench.json and bench.md")
    parser.add_argument("--sweeps", default=",".join(SWEEPS), help="comma-separated, of " + ", ".join(SWEEPS))
    parser.add_argument("--configs", default="", help="only these labels, e.g. 'B8 S256 D1024 H8 F4096 L8' (;-separated)")
    parser.add_argument("--torch-backends", default=",".join(BACKENDS),
                        help="comma-separated, of " + ", ".join(BACKENDS))
    parser.add_argument("--slow-everywhere", action="store_true",
                        help=f"run {', '.join(SLOW_BACKENDS)} on every config, not only the first of each sweep")
    parser.add_argument("--iterations", type=int, default=30, help="timed runs per measurement")
    parser.add_argument("--mk-timeout", type=int, default=300, help="seconds allowed per mk run")
    args = parser.parse_args()
    args.sweeps = parse_list(parser, "--sweeps", args.sweeps, list(SWEEPS))
    args.torch_backends = parse_list(parser, "--torch-backends", args.torch_backends, BACKENDS)
    args.configs = [c.strip() for c in args.configs.split(";") if c.strip()]
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
            "iterations": args.iterations, "torch_inputs_rotated": INPUTS, "slow_everywhere": args.slow_everywhere}
    print(f"{meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, commit {meta['commit']}, {meta['date']}",
          flush=True)
    ceilings = measure_ceilings(args.iterations)
    print(f"ceilings: cuBLAS bf16 8192^3 {ceilings['cublas_bf16_8192_tflops']:.0f} TFLOP/s, "
          f"D2D copy {ceilings['d2d_copy_gbps']:.0f} GB/s", flush=True)

    jobs = plan(args.sweeps, args.torch_backends, args.slow_everywhere)
    if args.configs:
        jobs = {cfg: backends for cfg, backends in jobs.items() if label(cfg) in args.configs}
    records = {}
    for number, (cfg, backends) in enumerate(jobs.items(), 1):
        print(f"== [{number}/{len(jobs)}] {label(cfg)} ({time.perf_counter() - started:.0f} s elapsed)", flush=True)
        records[cfg] = bench_config(mk, cfg, backends, args)
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
