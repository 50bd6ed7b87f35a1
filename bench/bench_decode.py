"""Decode benchmark: `mk generate`'s per-token latency against PyTorch decode loops on the same Llama weights: one
config per run, or a sweep of (shape, batch, context) configs in one process (--sweep, bench/decode_sweep.py)."""
import argparse
import copy
import inspect
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import compare_hf  # noqa: E402  (model specs, building and loading them)
import compare_hf_generate as hfgen  # noqa: E402  (saving for mk, teacher forcing, margins, the token comparison)
from bench import Fatal  # noqa: E402
from provenance import git_commit  # noqa: E402
from compare_hf import EngineError, Spec  # noqa: E402
from torch_backends import COMPILE_MODES, ERROR_CHARS, graph_runner, release  # noqa: E402

if __name__ == "__main__":  # decode_sweep.py imports this module by its name: let that find this copy
    sys.modules.setdefault("bench_decode", sys.modules[__name__])
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {
    "llama-3.2-1b": Spec("llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1e-5, True, LLAMA3_ROPE),
    "llama-3.1-8b": Spec("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 1e-5, False,
                         {**LLAMA3_ROPE, "factor": 8.0}),
    # About mk's tiny preset, with llama3 RoPE: builds and decodes in seconds on a CPU.
    "tiny": Spec("tiny", 256, 512, 2, 4, 2, 64, 1024, 4096, 1e-5, True,
                 {**LLAMA3_ROPE, "original_max_position_embeddings": 1024}),
}
# Weights' std: compare_hf_generate's 0.05 keeps tiny models' greedy tokens from looping, but at 1B's 16 layers it
# leaves PyTorch's bf16 logits ~9% (rel L2) from fp32 and every step a near-tie; transformers' default 0.02 gives ~3%
# there, with tokens that do not loop.
INIT_STD = {"llama-3.2-1b": 0.02, "llama-3.1-8b": 0.02, "tiny": hfgen.CONFIG["initializer_range"]}
BACKENDS = ("eager", "eager+graph", "reduce-overhead")
SLOW_BACKENDS = ("max-autotune",)
LABELS = {"eager": "torch eager", "eager+graph": "torch eager + CUDA graph",
          "reduce-overhead": "torch.compile reduce-overhead", "max-autotune": "torch.compile max-autotune"}
WARMUP_STEPS = 4  # compile on the first call; cudagraph trees record on the next ones
PREFILL_TOKENS = 8192  # tokens per torch prefill forward (batch x chunk): bounds its activations at batch 64, 4k
CHECK_SEQUENCES = 8  # sequences whose tokens are checked (each needs an fp32 forward over its whole context)
CONTEXT_ROUND = 128  # mk's default --max-context rounding
MAX_ARG_CHARS = 100_000  # Linux refuses one argument over 128 KiB: longer prompts go to mk as a tokens file
SEED = 20240603
DECODE_LINE = re.compile(r"^decode: (\d+) steps, per-token latency p50 ([\d.]+) (us|ms|s), p99 ([\d.]+) (us|ms|s); "
                         r"([\d.]+) tokens/s", re.M)
FLOOR_LINE = re.compile(r"^bandwidth floor: ([\d.e+-]+) GB of weights per step", re.M)
TO_US = {"us": 1.0, "ms": 1e3, "s": 1e6}
PROGRESS = sys.stderr.isatty()


def note(text: str) -> None:
    if PROGRESS:
        print(text, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank, as mk's report computes it (tools/generate.cc)."""
    ordered = sorted(values)
    return ordered[min(max(math.ceil(q * len(ordered)), 1), len(ordered)) - 1]


def timing(times_s: list[float], batch: int) -> dict:
    """p50 and p99 per step, and tokens/s over the steps' sum, as mk reports them."""
    return {"steps": len(times_s), "p50_us": percentile(times_s, 0.5) * 1e6, "p99_us": percentile(times_s, 0.99) * 1e6,
            "tokens_per_s": batch * len(times_s) / sum(times_s)}


@dataclass(frozen=True)
class DecodeConfig:
    """One measurement: batch sequences of prompt_len random ids, new_tokens greedy steps each, a KV cache of
    max_context positions (context = prompt_len + new_tokens, rounded up to whole KV blocks)."""
    batch: int
    prompt_len: int
    new_tokens: int
    max_context: int


class Stepper:
    """One static KV cache and the decode step's inputs in fixed tensors (token ids, position), so that a CUDA graph
    or cudagraph trees can replay the step while the loop only rewrites those tensors."""

    def __init__(self, model, prompts: torch.Tensor, max_context: int):
        from transformers import StaticCache

        self.model, self.prompts = model, prompts
        try:
            self.cache = StaticCache(config=model.config, max_cache_len=max_context)
        except TypeError:  # transformers 4 allocates the cache up front
            self.cache = StaticCache(config=model.config, max_batch_size=prompts.shape[0], max_cache_len=max_context,
                                     device=model.device, dtype=model.dtype)
        parameters = inspect.signature(model.forward).parameters
        self.cache_name = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.2x
        self.cache_position = "cache_position" in parameters  # older versions place new rows by it
        self.keep_name = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)
        self.prefilled = None  # the cache's length counters once the prompts are in it
        self.ids = torch.zeros((prompts.shape[0], 1), dtype=torch.long, device=model.device)
        self.position = torch.zeros((1, 1), dtype=torch.long, device=model.device)

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        kwargs = {self.cache_name: self.cache, "use_cache": True, "position_ids": positions.view(1, -1)}
        if self.cache_position:
            kwargs["cache_position"] = positions.view(-1)
        if last_only and self.keep_name:  # a prefill chunk: no (batch, chunk, vocab) logits
            kwargs[self.keep_name] = 1
        return self.model(input_ids=ids, **kwargs).logits[:, -1]

    def compute(self, ids: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(ids, position)
        return logits, logits.argmax(dim=-1)  # greedy on the device, as mk samples

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.compute(self.ids, self.position)

    def counters(self) -> list[torch.Tensor]:
        """The cache layers' length counters: transformers 5 places new rows by them (4 by cache_position)."""
        return [layer.cumulative_length for layer in getattr(self.cache, "layers", [])
                if torch.is_tensor(getattr(layer, "cumulative_length", None))]

    def start(self) -> None:
        """A cache holding every prompt token but the last, which the first step feeds: mk's generation makes every
        new token in a decode step too, so both time the same steps. The first call prefills (in chunks of
        PREFILL_TOKENS); later ones rewind the cache to that length: rows past it are masked until a step rewrites
        them, so every run decodes from the same state."""
        length = self.prompts.shape[1]
        if self.prefilled is None:
            self.cache.reset()
            chunk = max(1, PREFILL_TOKENS // self.prompts.shape[0])
            for begin in range(0, length - 1, chunk):
                end = min(begin + chunk, length - 1)
                self.logits(self.prompts[:, begin:end], torch.arange(begin, end, device=self.prompts.device), True)
            self.prefilled = [counter.clone() for counter in self.counters()]
            if not self.prefilled and not self.cache_position:  # nothing would rewind the cache between runs
                raise Fatal("this transformers' static cache has neither cache_position nor length counters")
        for counter, prefilled in zip(self.counters(), self.prefilled):
            counter.copy_(prefilled)
        self.ids.copy_(self.prompts[:, -1:])
        self.position.fill_(length - 1)


def decode(stepper: Stepper, run: Callable, steps: int,
           keep: int = 0) -> tuple[list[list[int]], list[float], torch.Tensor | None]:
    """Greedy tokens (batch, steps) from the prefilled prompts, each step's time, and the first `keep` sequences'
    logits (keep, steps, vocab). A step's time is the host's wall time from feeding the tokens to holding the next
    ones on the host, as mk times its steps (src/generate/generate.cc)."""
    cuda = stepper.ids.is_cuda
    made, times, kept, token = [], [], [], None
    with torch.no_grad():
        stepper.start()
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize()
            begin = time.perf_counter()
            if token is not None:
                stepper.ids.copy_(token.view(-1, 1))
                stepper.position.add_(1)
            logits, token = run()
            made.append(token.tolist())
            times.append(time.perf_counter() - begin)
            if keep:
                kept.append(logits[:keep].float())
    tokens = [list(sequence) for sequence in zip(*made)]
    return tokens, times, torch.stack(kept, dim=1) if keep else None


def step_graph(stepper: Stepper) -> Callable:
    """The step captured once in a CUDA graph over the stepper's fixed tensors, replayed for every token."""
    with torch.no_grad():
        stepper.start()  # the cache's tensors exist before capture (transformers 5 allocates them on first use)
        replay = graph_runner(lambda _: stepper.step(), [None])
    return lambda: replay(0)


def compiled_runner(stepper: Stepper, mode: str, info: dict) -> Callable:
    """torch.compile of the step, fullgraph unless dynamo breaks the graph (then recorded in info), warmed up."""
    for fullgraph in (True, False):
        torch._dynamo.reset()  # each backend compiles afresh: no recompile limit reached, no graphs of another mode
        run = tree_runner(torch.compile(stepper.compute, mode=mode, fullgraph=fullgraph), stepper)
        try:
            decode(stepper, run, WARMUP_STEPS)
        except Exception as error:  # a graph break under fullgraph: compile it in pieces instead
            if not fullgraph:
                raise
            info["fullgraph_error"] = f"{type(error).__name__}: {error}"[:ERROR_CHARS]
            note(f"  fullgraph failed ({type(error).__name__}); compiling with graph breaks")
            continue
        info["fullgraph"] = fullgraph
        return run
    raise AssertionError("unreachable")


def tree_runner(compiled: Callable, stepper: Stepper) -> Callable:
    def run():
        torch.compiler.cudagraph_mark_step_begin()  # the loop has read the previous step's outputs
        return compiled(stepper.ids, stepper.position)

    return run


def bench_backend(backend: str, stepper: Stepper, steps: int, keep: int) -> dict:
    info = {}
    start = time.perf_counter()
    if backend == "eager":
        run = stepper.step
    elif backend == "eager+graph":
        run = step_graph(stepper)
    else:
        run = compiled_runner(stepper, COMPILE_MODES[backend], info)
    decode(stepper, run, WARMUP_STEPS)
    setup_s = time.perf_counter() - start
    tokens, times, logits = decode(stepper, run, steps, keep)
    batch = len(tokens)
    return {**timing(times, batch), "setup_s": setup_s, **info, "tokens": tokens, "logits": logits}


def bench_torch(model, prompts: torch.Tensor, config: DecodeConfig, backends: list[str], keep: int,
                skipped: dict[str, str]) -> dict:
    """Every backend on the bf16 model (transformers' SDPA attention, on the device) and one static cache; eager
    first: the others are checked against its tokens, and it keeps the first `keep` sequences' logits."""
    stepper = Stepper(model, prompts.to(model.device), config.max_context)
    results = {}
    try:
        for backend in backends:
            if backend in skipped:
                results[backend] = {"skipped": skipped[backend]}
                continue
            note(f"{LABELS[backend]} ...")
            try:
                results[backend] = bench_backend(backend, stepper, config.new_tokens, keep if backend == "eager" else 0)
            except Exception as error:  # a compile error or OOM in one backend must not lose the others
                if backend == "eager":
                    raise Fatal(f"torch eager decode failed: {type(error).__name__}: {error}") from error
                results[backend] = {"error": f"{type(error).__name__}: {error}"[:ERROR_CHARS]}
            torch._dynamo.reset()
    finally:
        del stepper
        release()
    return results


def fp32_twin(model):
    """The bf16 model's fp32 copy on its device, with transformers' eager attention: bf16 -> fp32 is exact, so it is
    the fp32 model as loaded from the same weights, provided its buffers (RoPE's frequencies) are fp32 already."""
    if any(buf.is_floating_point() and buf.dtype != torch.float32 for buf in model.buffers()):
        raise Fatal("the bf16 model has buffers not in fp32: its fp32 copy would not be the fp32 model")
    twin = copy.deepcopy(model).float()
    twin.set_attn_implementation("eager")
    return twin.eval()


def torch_reference(model, prompts: list[list[int]], eager: dict) -> hfgen.Reference:
    """For each of `prompts` (eager's first sequences): eager's tokens and, at each step, its margin over every other
    token and the noise on it (as compare_hf_generate.py computes them): e = eager's bf16 logits - the fp32 model's on
    the same tokens, and mk trusted within delta = BF16_FACTOR * max |e| of fp32 (the tolerance policy: twice
    PyTorch's bf16 error)."""
    model32 = fp32_twin(model)
    margins, noises, stats = [], [], {"torch_bf16_rel_l2": [], "delta_max": 0.0, "sequences": len(prompts)}
    for b, prompt in enumerate(prompts):
        fp32 = hfgen.teacher_forced(model32, prompt, eager["tokens"][b], len(eager["tokens"][b]))
        bf16 = eager["logits"][b].to(fp32.device)
        delta = compare_hf.BF16_FACTOR * (bf16.double() - fp32.double()).abs().max(dim=-1, keepdim=True).values
        margin, noise = hfgen.margins_within(bf16, fp32, delta)
        margins.append(margin)
        noises.append(noise)
        stats["torch_bf16_rel_l2"].append(hfgen.rel_l2(bf16, fp32))
        stats["delta_max"] = max(stats["delta_max"], delta.max().item())
        del fp32, bf16
    del model32
    release()
    worst = max(stats["torch_bf16_rel_l2"])
    if not worst <= hfgen.HF_BF16_SANE_REL_L2:
        raise Fatal(f"torch's bf16 decode is {worst:.3g} (rel L2) from the fp32 model on the same tokens: the "
                    "static-cache loop did not compute the model (positions? cache?)")
    tokens = eager["tokens"][:len(prompts)]
    reference = hfgen.Reference(prompts, tokens, torch.stack(margins), torch.stack(noises), stats)
    stats["contested_steps"] = int(reference.contested().sum())
    return reference


def check_tokens(reference: hfgen.Reference, tokens: list[list[int]]) -> dict:
    """The reference's sequences' tokens against eager's, each up to its first difference: at a near-tie (eager's
    margin over the token made within its noise) that sequence's comparison ends, since the contexts differ from
    there; any other difference is a mismatch."""
    check = {"sequences": len(reference.tokens), "compared": 0, "matched": 0, "near_ties": [], "mismatches": []}
    for b, made in enumerate(tokens[:len(reference.tokens)]):
        compared, entry = hfgen.first_difference(reference, b, made)
        check["compared"] += compared
        check["matched"] += compared - (entry is not None)
        if entry is not None:
            check["near_ties" if entry["margin"] <= entry["noise"] else "mismatches"].append(entry)
    check["passed"] = not check["mismatches"]
    return check


def mk_command(args: argparse.Namespace, directory: Path, prompts: list[list[int]], config: DecodeConfig) -> list[str]:
    command = [str(args.mk), "generate", "--model", str(directory), "--engine", args.engine, "--max-new-tokens",
               str(config.new_tokens), "--max-context", str(config.max_context), "--stream", "none", "--batch",
               str(len(prompts)), "--steps-per-sync", str(args.mk_steps_per_sync)]
    ids = ";".join(",".join(map(str, prompt)) for prompt in prompts)
    if len(ids) <= MAX_ARG_CHARS:
        return command + ["--prompt-ids", ids]
    from safetensors.torch import save_file

    path = directory.parent / "prompts.safetensors"  # beside the model: not one of its weight files
    save_file({"tokens": torch.tensor(prompts, dtype=torch.int32)}, str(path))
    return command + ["--tokens", str(path)]


def parse_mk(stdout: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """mk's decode timing line, its weight-only bandwidth floor, and its sequences (`tokens:` lines: prompt ids, then
    the new ones)."""
    match = DECODE_LINE.search(stdout)
    if match is None:
        raise EngineError(f"mk printed no 'decode:' line:\n{compare_hf.tail(stdout)}")
    if int(match[1]) != new_tokens:
        raise EngineError(f"mk ran {match[1]} decode steps, expected {new_tokens}")
    sequences = [[int(i) for i in line.split()] for line in re.findall(r"^tokens: (.*)$", stdout, re.M)]
    if len(sequences) != len(prompts):
        raise EngineError(f"mk printed {len(sequences)} 'tokens:' lines for {len(prompts)} prompts")
    for b, (prompt, sequence) in enumerate(zip(prompts, sequences)):
        if sequence[:len(prompt)] != prompt or len(sequence) != len(prompt) + new_tokens:
            raise EngineError(f"mk's sequence {b} is not its prompt plus {new_tokens} new tokens")
    floor = FLOOR_LINE.search(stdout)
    return {"steps": new_tokens, "p50_us": float(match[2]) * TO_US[match[3]],
            "p99_us": float(match[4]) * TO_US[match[5]], "tokens_per_s": float(match[6]),
            "weights_gb": float(floor[1]) if floor else None,
            "tokens": [sequence[len(prompt):] for prompt, sequence in zip(prompts, sequences)],
            "log": [line for line in stdout.splitlines() if not line.startswith("tokens: ")]}


def bench_mk(args: argparse.Namespace, directory: Path, prompts: list[list[int]], config: DecodeConfig) -> dict:
    note(f"mk generate --engine {args.engine} ...")
    command = mk_command(args, directory, prompts, config)
    start = time.perf_counter()
    try:
        result = parse_mk(hfgen.run_mk(command, args.mk_timeout, echo=False), prompts, config.new_tokens)
    except EngineError as error:
        return {"error": str(error)[:ERROR_CHARS]}
    return {**result, "wall_s": time.perf_counter() - start}


def row(name: str, result: dict, mk_p50: float | None) -> list[str]:
    if "skipped" in result or "error" in result:
        return [name, "-", "-", "-", "-", f"skipped: {result['skipped']}" if "skipped" in result else "ERROR"]
    check = result.get("check")
    verdict = ("reference" if check is None else
               f"MISMATCH at step {check['mismatches'][0]['step']}" if check["mismatches"] else
               f"{check['matched']} of {check['compared']} match" +
               (f", near-tie at step {check['near_ties'][0]['step']}" if check["near_ties"] else ""))
    ratio = f"{result['p50_us'] / mk_p50:.2f}" if mk_p50 else "-"
    return [name, f"{result['p50_us']:.1f}", f"{result['p99_us']:.1f}", f"{result['tokens_per_s']:.1f}", ratio,
            verdict]


def markdown(report: dict) -> str:
    meta, shape, run = report["meta"], report["shape"], report["run"]
    mk = report["mk"]
    lines = [
        "# Decode: mk vs PyTorch", "",
        f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, commit {meta['commit']}, "
        f"{meta['date']}.",
        f"Model {shape['name']}: {shape['layers']} layers, hidden {shape['hidden']}, {shape['heads']} heads "
        f"({shape['kv_heads']} kv), vocab {shape['vocab']}; random bf16 weights. Batch {run['batch']}, prompt "
        f"{run['prompt_len']} random ids, {run['new_tokens']} greedy new tokens, KV cache of {run['max_context']} "
        f"positions (mk's --max-context, torch's StaticCache).",
        "Per-token latency: the host's wall time from feeding a step's tokens to holding the next ones, p50 and p99 "
        f"over the steps (mk: one wait for the engine every {run.get('mk_steps_per_sync', 1)} steps at most, a group's "
        "time spread evenly over its steps); tokens/s = batch x steps / their sum. Tokens: each sequence against "
        "torch eager's up to the first difference; one where eager's margin is within its bf16 noise (near-tie) "
        "ends that sequence's comparison, any other fails the benchmark.", "",
        "| backend | p50 us | p99 us | tokens/s | p50 / mk p50 | tokens vs eager |", "|---|---|---|---|---|---|",
    ]
    mk_p50 = mk.get("p50_us")
    rows = [row(f"mk ({run['engine']})", mk, mk_p50)]
    rows += [row(LABELS[name], result, mk_p50) for name, result in report["torch"].items()]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    stats = report["reference"]
    lines += ["", f"Correctness: {'PASS' if report['passed'] else 'FAIL'} ({stats['sequences']} of {run['batch']} "
                  f"sequences checked). Eager's steps with a near-tie rival: {stats['contested_steps']} of "
                  f"{stats['sequences'] * run['new_tokens']}; torch bf16 vs fp32 rel L2 "
                  f"{max(stats['torch_bf16_rel_l2']):.2e}."] + report["problems"]
    return "\n".join(lines) + "\n"


def problems_of(mk: dict, results: dict) -> list[str]:
    problems = []
    for name, result in [("mk", mk)] + [(LABELS[key], value) for key, value in results.items()]:
        if "error" in result:
            problems.append(f"- {name} failed: {result['error'].strip().splitlines()[-1][:300]}")
        for entry in result.get("check", {}).get("mismatches", []):
            problems.append(f"- {name}: sequence {entry['sequence']} step {entry['step']}: made {entry['mk']}, eager "
                            f"{entry['hf']}; eager's margin over it {entry['margin']:.4g} exceeds its noise "
                            f"{entry['noise']:.4g}")
    return problems


def meta_of(args: argparse.Namespace) -> dict:
    import transformers

    return {"device": torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} threads)",
            "torch": torch.__version__, "transformers": transformers.__version__, "commit": git_commit(ROOT),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "mk": str(args.mk),
            "engine": args.engine, "torch_device": args.device, "seed": SEED, "warmup_steps": WARMUP_STEPS}


def build_report(args: argparse.Namespace, spec: Spec, config: DecodeConfig, measured: dict) -> dict:
    """Everything measured, for decode.json; the eager logits stay out."""
    return {"meta": meta_of(args), "shape": asdict(spec),
            "run": {**asdict(config), "engine": args.engine, "mk_steps_per_sync": args.mk_steps_per_sync},
            **measured, "passed": not measured["problems"]}


def parse_args() -> argparse.Namespace:
    import decode_sweep

    parser = argparse.ArgumentParser(description=__doc__, epilog="On an H200, Llama-3.2-1B's shape at batch 1, 896 "
                                     "prompt tokens, 128 new: python3 bench/bench_decode.py --out out/decode. "
                                     + decode_sweep.EPILOG)
    parser.add_argument("--mk", type=Path, default=ROOT / "build" / "mk", help="the mk binary (default: build/mk)")
    parser.add_argument("--out", type=Path, help="directory for decode.json and decode.md (a sweep's: decode-sweep*)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "mk-bench-decode",
                        help="scratch directory: models are saved in its model-*/, and reused while their recipe "
                        "(shape, init, seed, device, transformers) is the same")
    parser.add_argument("--tiny", action="store_true", help="a tiny model for smoke tests (default: Llama-3.2-1B)")
    parser.add_argument("--layers", type=int, help="layers (default: the shape's 16, or 2 with --tiny)")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    parser.add_argument("--prompt-len", type=int, help="random prompt ids per sequence (default 896)")
    parser.add_argument("--new-tokens", type=int, help="greedy tokens per sequence, decode steps (default 128; in a "
                        "sweep, for the configs without an nN of their own)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where torch runs; cpu skips the CUDA graph and torch.compile backends")
    parser.add_argument("--engine", choices=("gpu", "cpu-vm", "reference"), default="gpu", help="mk's engine")
    parser.add_argument("--slow", action="store_true", help="also torch.compile mode max-autotune (autotunes)")
    parser.add_argument("--skip-compile-above-batch", type=int, metavar="N",
                        help="leave out the torch.compile backends at batches above N (each compiles for a minute)")
    parser.add_argument("--check-sequences", type=int, default=CHECK_SEQUENCES, metavar="N",
                        help=f"check the tokens of the first N sequences (each needs an fp32 forward over its "
                        f"context; default {CHECK_SEQUENCES})")
    parser.add_argument("--mk-timeout", type=int, default=900, help="seconds allowed for mk")
    parser.add_argument("--mk-steps-per-sync", type=int, default=1, metavar="N",
                        help="mk generate's --steps-per-sync: greedy steps a wait for the GPU (default 1: a wait "
                             "every step, as the torch loops wait)")
    decode_sweep.add_arguments(parser)
    args = parser.parse_args()
    for name in ("batch", "prompt_len", "new_tokens", "layers", "check_sequences"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def check_setup(args: argparse.Namespace) -> None:
    args.mk = args.mk.resolve()
    if not (args.mk.is_file() and os.access(args.mk, os.X_OK)):
        raise Fatal(f"--mk {args.mk}: not an executable file (cmake -S . -B build -G Ninja && cmake --build build)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Fatal("CUDA is not available to torch (--device cpu runs torch on the CPU)")
    torch.set_float32_matmul_precision("highest")  # the fp32 reference in fp32, not TF32


def run(args: argparse.Namespace) -> int:
    """One config: decode_sweep's measure() of a sweep of one, reported backend by backend."""
    import decode_sweep as sweep

    check_setup(args)
    spec = SHAPES["tiny" if args.tiny else "llama-3.2-1b"]
    spec = replace(spec, layers=args.layers or spec.layers)
    prompt_len, new_tokens = args.prompt_len or 896, args.new_tokens or 128
    config = DecodeConfig(args.batch, prompt_len, new_tokens, sweep.context_of(prompt_len + new_tokens))
    directory, model = sweep.prepare_model(spec, args.work, args.device)
    measured = sweep.measure(args, spec, directory, model, config, sweep.skipped_backends(args, config.batch))
    report = build_report(args, spec, config, measured)
    print(sweep.write(report, markdown(report), args.out, "decode"), end="")
    if report["problems"]:
        print("bench_decode: FAILED:\n" + "\n".join(report["problems"]), file=sys.stderr)
        return 1
    return 0


def main() -> int:
    args = parse_args()
    try:
        if args.sweep or args.merge:
            import decode_sweep

            return decode_sweep.main(args)
        return run(args)
    except Fatal as error:  # the benchmark cannot run at all
        print(f"bench_decode: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
