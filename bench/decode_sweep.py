"""bench_decode.py --sweep: many (shape, batch, context) configs in one process, so that mk and every torch backend
share the GPU and the weights; each shape's model is built once and serves all of its configs. Also the measurement
of one config (prepare_model, measure), which bench_decode.py's single run uses as a sweep of one.

SPEC: a shape (1b, 8b, tiny, or a name in bench_decode.SHAPES), then bN (batch), cN (context: prompt + new tokens,
the KV cache's positions; c1k = 1024), optionally nN (new tokens, decode steps: default min(128, context / 2)) and
lN (layers, to shrink a shape); words separated by spaces or '_' ('8b_b8_c4k'). `issue` stands for the issue's
grid: 1b and 8b x batch 1, 8, 32, 64 x context 128, 1k, 4k. Configs run grouped by shape, the smaller model first,
each shape's cheapest configs (batch x context) first.
Every config is a row; one that fails (out of memory, an mk error, a compile failure, a wrong token) is marked
ERROR with its message and the sweep goes on; the exit status is 1 if any row is not OK."""
import contextlib
import functools
import io
import itertools
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

import bench_decode as bd  # first: it puts scripts/ on the path
import compare_hf
import compare_hf_generate as hfgen
from compare_hf import Spec
from torch_backends import ERROR_CHARS, release

ALIASES = {"1b": "llama-3.2-1b", "8b": "llama-3.1-8b"}
ISSUE = [f"{shape} b{batch} c{context}" for shape in ("1b", "8b") for batch in (1, 8, 32, 64)
         for context in (128, 1024, 4096)]
BANDWIDTH = 4.2e12  # bytes/s: mk's default --bandwidth, the H200's measured HBM bandwidth
H200_BYTES = 139.8 * 2**30  # the memory budget mk generate --engine gpu checks against on an H200
FIELD = re.compile(r"^([bcnl])(\d+)(k?)$")
EPILOG = ("The issue's grid on an H200 in calls of under 10 minutes: python3 bench/bench_decode.py --sweep issue "
          "--skip-compile-above-batch 8 --part 1/5 --time-budget 420 --out out/sweep, then parts 2/5 ... 5/5 "
          "(--plan lists each part's configs and estimated seconds; --merge out/sweep/decode-sweep-part*.json joins "
          "the parts into one table).")


@dataclass
class Item:
    label: str
    spec: Spec  # the shape, with its layer count
    config: bd.DecodeConfig


def add_arguments(parser) -> None:
    group = parser.add_argument_group("sweep (bench/decode_sweep.py)")
    group.add_argument("--sweep", metavar="SPECS", help="configs separated by ';', each 'SHAPE bN cN [nN] [lN]' "
                       "(e.g. '1b b1 c1024;8b b8 c4096'), or 'issue' for the issue's grid of 24")
    group.add_argument("--part", metavar="K/N", help="run only the K-th of N consecutive parts of the sweep, cut "
                       "where the estimated times balance (each part builds the models it needs)")
    group.add_argument("--plan", action="store_true", help="print the parts' configs and estimated times, run nothing")
    group.add_argument("--time-budget", type=float, metavar="S", help="start no config whose estimate would end "
                       "past S seconds after the sweep's start (it becomes a NOT RUN row)")
    group.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="join parts' decode-sweep*.json into "
                       "one table (written to --out), run nothing")


def prepare_model(spec: Spec, work: Path, device: str):
    """The random bf16 model, saved for both sides with no EOS id (every sequence runs the full count), built on
    `device` (fast init) unless `work` holds one from the same recipe; for torch, on the CPU with SDPA attention:
    measure() moves it to the device and back."""
    import transformers

    directory = work / f"model-{spec.name}-{spec.layers}l"
    recipe = json.dumps({"spec": asdict(spec), "std": bd.INIT_STD[spec.name], "seed": compare_hf.SEED,
                         "device": device, "transformers": transformers.__version__}, sort_keys=True)
    marker = directory / "bench_decode_recipe.json"
    if not bd.PROGRESS:
        transformers.utils.logging.disable_progress_bar()
    if marker.is_file() and marker.read_text() == recipe:
        bd.note(f"reusing {spec.name} ({spec.layers} layers) in {directory}")
        return directory, compare_hf.load_hf(directory, torch.bfloat16, "cpu", attention="sdpa")
    bd.note(f"building {spec.name} ({spec.layers} layers) in {directory} ...")
    with contextlib.redirect_stdout(sys.stderr if bd.PROGRESS else io.StringIO()):  # it prints config.json
        overrides = {**hfgen.SPECIAL_TOKENS, "initializer_range": bd.INIT_STD[spec.name]}
        model = hfgen.save_model(spec, directory, overrides, device)  # loaded back from the files, on the CPU
    marker.write_text(recipe)
    release()
    model.set_attn_implementation("sdpa")
    return directory, model


def measure(args, spec: Spec, directory: Path, model, config: bd.DecodeConfig,
            skipped: dict[str, str]) -> dict:
    """One config: mk first (torch then holds no GPU memory: its model waits on the CPU), then torch's backends and
    the fp32 reference with the model on the device, and every backend's tokens checked against eager's."""
    if config.max_context > spec.max_positions:
        raise bd.Fatal(f"a KV cache of {config.max_context} positions exceeds the model's {spec.max_positions}")
    prompts = torch.randint(0, spec.vocab, (config.batch, config.prompt_len),
                            generator=torch.Generator().manual_seed(bd.SEED))
    mk = bd.bench_mk(args, directory, prompts.tolist(), config)
    if "error" in mk and args.sweep:  # the row failed: torch's loops (minutes at 8B, batch 64) would not save it
        return {"mk": mk, "torch": {}, "reference": None, "problems": bd.problems_of(mk, {})}
    backends = list(bd.BACKENDS) + (list(bd.SLOW_BACKENDS) if args.slow else [])
    keep = min(config.batch, args.check_sequences)
    try:
        model.to(args.device)
        results = bd.bench_torch(model, prompts, config, backends, keep, skipped)
        bd.note("fp32 reference ...")
        reference = bd.torch_reference(model, prompts[:keep].tolist(), results["eager"])
    except Exception as error:  # eager or the reference failed (out of memory?): in a sweep, keep mk's result
        if not args.sweep:
            raise
        message = f"torch: {type(error).__name__}: {error}"[:ERROR_CHARS]
        return {"mk": mk, "torch": {}, "reference": None, "error": message, "problems": [f"- {message}"]}
    finally:
        model.to("cpu")
        release()
    for result in [mk] + [results[name] for name in backends if name != "eager"]:
        if "tokens" in result:
            result["check"] = bd.check_tokens(reference, result["tokens"])
    torch_results = {name: {k: v for k, v in result.items() if k != "logits"} for name, result in results.items()}
    return {"mk": mk, "torch": torch_results, "reference": reference.stats, "prompts": reference.prompts,
            "problems": bd.problems_of(mk, results)}


def skipped_backends(args, batch: int) -> dict[str, str]:
    """Backends not run, and why: on the CPU all but eager; torch.compile above --skip-compile-above-batch."""
    if args.device == "cpu":
        return {name: "needs CUDA (--device cuda)" for name in bd.LABELS if name != "eager"}
    limit = args.skip_compile_above_batch
    if limit is None or batch <= limit:
        return {}
    return {name: f"batch above --skip-compile-above-batch {limit}" for name in bd.COMPILE_MODES}


def context_of(tokens: int) -> int:
    return -(-tokens // bd.CONTEXT_ROUND) * bd.CONTEXT_ROUND  # mk's default --max-context: whole KV blocks


def parse_spec(text: str, new_tokens: int | None) -> Item:
    words = text.replace("_", " ").split()
    if not words or ALIASES.get(words[0], words[0]) not in bd.SHAPES:
        raise ValueError(f"'{text}': a config starts with a shape: {', '.join([*ALIASES, *bd.SHAPES])}")
    values = {}
    for word in words[1:]:
        match = FIELD.match(word)
        if match is None or match[1] in values:
            raise ValueError(f"'{text}': '{word}' is not one of bN, cN, nN, lN (each once; N may end in k)")
        values[match[1]] = int(match[2]) * (1024 if match[3] else 1)
    if "b" not in values or "c" not in values or min(values.values()) < 1:
        raise ValueError(f"'{text}': a config needs a batch bN and a context cN, each at least 1")
    spec = bd.SHAPES[ALIASES.get(words[0], words[0])]
    spec = replace(spec, layers=values.get("l", spec.layers))
    context = values["c"]
    new = values.get("n", new_tokens or min(128, context // 2))
    if not 1 <= new < context:
        raise ValueError(f"'{text}': {new} new tokens leave no prompt in a context of {context}")
    alias = next((key for key, name in ALIASES.items() if name == spec.name), spec.name)
    extra = [f"{key}{values[key]}" for key in "nl" if key in values]
    label = " ".join([alias, f"b{values['b']}", f"c{context}", *extra])
    return Item(label, spec, bd.DecodeConfig(values["b"], context - new, new, context_of(context)))


def expand(text: str, new_tokens: int | None) -> list[Item]:
    """The configs in run order: by shape (fewest parameters first), then by batch x context, then batch."""
    specs = [spec for part in text.split(";") if part.strip()
             for spec in (ISSUE if part.strip() == "issue" else [part.strip()])]
    items = {item.label: item for item in (parse_spec(spec, new_tokens) for spec in specs)}  # each config once
    return sorted(items.values(), key=lambda item: (parameters(item.spec), item.spec.name,
                                                    item.config.batch * item.config.max_context, item.config.batch))


def parameters(spec: Spec) -> int:
    attention = spec.hidden * spec.head_dim * (2 * spec.heads + 2 * spec.kv_heads)
    layer = attention + 3 * spec.hidden * spec.intermediate + 2 * spec.hidden
    return spec.layers * layer + spec.vocab * spec.hidden * (1 if spec.tied else 2) + spec.hidden


def estimate_s(item: Item, args, build: bool) -> float:
    """Seconds on an H200, for --part and --time-budget. Per billion parameters (B): mk 4 s + 4 s/B (start,
    weights) + 5e-5 s/B per prefill token (schedules, prefill); the model's trips to the GPU and back 0.6 s/B;
    torch's prefill at ~400 TFLOP/s; eager 12 ms + 2 ms/B a step (docs/perf.md: 15 ms at 1B), eager + CUDA graph
    1 s + ~1 ms a step, over 2 x 4 warm-up steps and the timed ones; torch.compile 1 s + 0.8 s a layer; the fp32
    reference at ~50 TFLOP/s over the checked sequences; building a model 10 s + 5 s/B. NOTE: calibrated on the
    twenty-first session's runs 5-6 (mk 5.2-7.6 s at 1B, 38.8 s at 8B batch 32; reduce-overhead's setup 11.6-14.8 s
    at 16 layers, 27.1 s at 32) and the thirty-fourth's runs 2-3 (the 1B grid within -3..+7 s a config of these
    terms; 8B configs 12-17 s above the previous 2.5 s/B, the 8B model built in ~50 s, not 90); the rest are
    guesses still."""
    billions, config = parameters(item.spec) / 1e9, item.config
    if args.engine == "gpu" and mk_bytes(item, 1) > H200_BYTES:  # mk refuses it at once; torch is then not run
        return 5 + (10 + 5 * billions if build else 0)
    steps, prefill = 2 * bd.WARMUP_STEPS + config.new_tokens, config.batch * config.prompt_len
    seconds = 4 + 4 * billions + prefill * billions * 5e-5  # mk
    seconds += 0.6 * billions + prefill * billions * 5e-6  # the model's trips, torch's prefill
    seconds += steps * (0.012 + 0.002 * billions) + 1 + steps * 0.001 * (1 + billions)  # eager, eager + graph
    if "reduce-overhead" not in skipped_backends(args, config.batch):
        seconds += 1 + 0.8 * item.spec.layers + steps * 0.001 * (1 + billions)
    checked = min(config.batch, args.check_sequences) * config.max_context
    seconds += 1 + 0.4 * billions + checked * billions * 4e-5  # the fp32 copy, teacher forcing
    return seconds + (10 + 5 * billions if build else 0)


def mk_bytes(item: Item, prefill_sequences: int) -> float:
    """What `mk generate --engine gpu` allocates, as its memory check counts it (generation_memory): bf16 weights,
    the KV cache, and the prefill's activations, which keep every layer's buffers for the prompts of one prefill
    pass. mk prefills in as many passes as the budget needs, so it refuses only what one sequence's pass exceeds."""
    spec, config = item.spec, item.config
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    per_token = spec.layers * (4 * spec.hidden + 2 * q + 2 * kv + spec.intermediate)
    cache = config.batch * config.max_context * spec.layers * 2 * kv
    return 2 * (parameters(item.spec) + cache + prefill_sequences * (config.prompt_len - 1) * per_token)


def costs(items: list[Item], args) -> list[float]:
    """Each config's estimate, a model build counted where its shape starts."""
    return [estimate_s(item, args, i == 0 or (items[i - 1].spec != item.spec)) for i, item in enumerate(items)]


def partition(items: list[Item], parts: int, args) -> list[list[Item]]:
    """The sweep cut into `parts` consecutive parts whose longest estimated time (each part building the models of
    its shapes) is the shortest possible."""
    if parts > len(items):
        raise bd.Fatal(f"--part: {parts} parts of {len(items)} configs")
    chunk_s = functools.cache(lambda a, b: sum(costs(items[a:b], args)))
    bounds = lambda cuts: list(zip((0, *cuts), (*cuts, len(items))))  # noqa: E731
    cuts = min(itertools.combinations(range(1, len(items)), parts - 1),
               key=lambda cuts: max(chunk_s(a, b) for a, b in bounds(cuts)))
    return [items[a:b] for a, b in bounds(cuts)]


def parse_part(part: str | None) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", part or "1/1")
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise bd.Fatal(f"--part {part}: expected K/N with 1 <= K <= N")
    return int(match[1]), int(match[2])


def plan(items: list[Item], args) -> int:
    for k, chosen in enumerate(partition(items, parse_part(args.part)[1], args), 1):
        seconds = costs(chosen, args)
        print(f"part {k}: {len(chosen)} configs, about {sum(seconds) / 60:.1f} min")
        for item, cost in zip(chosen, seconds):
            print(f"  {item.label:<22} prompt {item.config.prompt_len:>5} + {item.config.new_tokens:>3} new, "
                  f"~{cost:.0f} s")
    return 0


def floor_of(item: Item, mk: dict) -> dict:
    """The bandwidth floor of mk's median step: the weights it reads (mk's 'bandwidth floor' line: weights only)
    plus the KV cache rows that step's attention reads (prompt + new / 2 per sequence, K and V, bf16), computed
    here, at 4.2 TB/s."""
    spec, config = item.spec, item.config
    rows = config.prompt_len + config.new_tokens // 2
    kv = config.batch * spec.layers * rows * 2 * spec.kv_heads * spec.head_dim * 2
    weights = mk["weights_gb"] * 1e9
    floor_us = (weights + kv) / BANDWIDTH * 1e6
    return {"weights_gb": weights / 1e9, "kv_gb": kv / 1e9, "floor_us": floor_us,
            "mk_percent": 100 * floor_us / mk["p50_us"]}


def summarize(row: dict, item: Item) -> None:
    """The row's best torch backend, its ratio to mk, mk's share of the floor, and its status: ERROR if mk or a
    torch backend failed, FAIL if a token check did, else OK."""
    mk, timed = row["mk"], {name: r for name, r in row["torch"].items() if "p50_us" in r}
    if timed:
        row["best_torch"] = min(timed, key=lambda name: timed[name]["p50_us"])
        if "p50_us" in mk:
            row["best_over_mk"] = timed[row["best_torch"]]["p50_us"] / mk["p50_us"]
    if mk.get("weights_gb"):
        row["floor"] = floor_of(item, mk)
    failed = any("error" in result for result in [row, mk, *row["torch"].values()])
    row["status"] = "ERROR" if failed else "FAIL" if row["problems"] else "OK"


def run_config(args, item: Item, directory: Path, model) -> dict:
    begin = time.perf_counter()
    row = {"config": item.label, "shape": item.spec.name, "layers": item.spec.layers, **asdict(item.config)}
    try:
        measured = measure(args, item.spec, directory, model, item.config,
                              skipped_backends(args, item.config.batch))
        measured.pop("prompts", None)
        row.update(measured)
        summarize(row, item)
    except Exception as error:  # out of memory, a failed eager loop, a bad config: this row only
        row.update(status="ERROR", error=f"{type(error).__name__}: {error}"[:ERROR_CHARS])
        release()
    row["wall_s"] = time.perf_counter() - begin
    return row


def run_shape(args, items: list[Item], emit, deadline: float | None) -> None:
    """One shape's configs on one build of its model; the model is freed after them. A config that the time budget
    would not fit is a NOT RUN row (all of them, unbuilt, if the first one and the build would not fit)."""
    def late(item: Item, build: bool) -> bool:
        return deadline is not None and time.perf_counter() + estimate_s(item, args, build) > deadline

    def not_run(item: Item, why: str) -> dict:
        return {"config": item.label, "status": "ERROR" if why else "NOT RUN",
                "error": why or "the --time-budget would run out", "wall_s": 0.0}

    try:
        if late(items[0], True):
            raise TimeoutError
        directory, model = prepare_model(items[0].spec, args.work, args.device)
    except Exception as error:
        why = "" if isinstance(error, TimeoutError) else f"building the model failed: {type(error).__name__}: {error}"
        for item in items:
            emit(not_run(item, why[:ERROR_CHARS]))
        release()
        return
    for item in items:
        emit(not_run(item, "") if late(item, False) else run_config(args, item, directory, model))
    del model
    release()


def cell(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tokens_cell(row: dict) -> str:
    """PASS or FAIL over every backend's check; mk's matched / compared tokens and near-ties."""
    check = row.get("mk", {}).get("check")
    if row.get("reference") is None:
        return "-"
    failed = any(r.get("check", {}).get("mismatches") for r in [row["mk"], *row["torch"].values()])
    verdict = "FAIL" if failed else "PASS"
    if check is None:
        return verdict
    ties = f", {len(check['near_ties'])} ties" if check["near_ties"] else ""
    return f"{verdict} (mk {check['matched']}/{check['compared']}{ties})"


def notes_cell(row: dict) -> str:
    text = row.get("error") or "; ".join(problem.lstrip("- ") for problem in row.get("problems", []))
    text = " ".join(text.split()).replace("|", "\\|")
    return text[:240] + ("..." if len(text) > 240 else "")


def table_row(row: dict, backends: list[str]) -> str:
    mk, torch_results, floor = row.get("mk", {}), row.get("torch", {}), row.get("floor", {})

    def backend(name):
        result = torch_results.get(name, {})
        return ("skipped" if "skipped" in result else "ERROR" if "error" in result else cell(result.get("p50_us")))

    best = row.get("best_torch")
    cells = [row["config"], row["status"] if row["status"] != "OK" and "p50_us" not in mk else cell(mk.get("p50_us")),
             cell(mk.get("p99_us"))] + [backend(name) for name in backends]
    cells += [bd.LABELS[best].replace("torch ", "") if best else "-", cell(row.get("best_over_mk"), 2),
              cell(floor.get("floor_us")), cell(floor.get("mk_percent")), tokens_cell(row), cell(row["wall_s"], 0),
              (row["status"] + ": " if row["status"] != "OK" else "") + notes_cell(row)]
    return "| " + " | ".join(cells) + " |"


def markdown(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    backends = [name for name in bd.LABELS if any(name in row.get("torch", {}) for row in rows)]
    header = ["config", "mk p50 us", "mk p99 us"] + [f"{name} p50 us" for name in backends] + [
        "best torch", "best torch / mk", "floor us", "mk % of floor", "tokens vs eager", "wall s", "notes"]
    lines = [
        "# Decode sweep: mk vs PyTorch", "",
        f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, commit {meta['commit']}, "
        f"{meta['date']}; mk engine {meta['engine']}. Sweep '{report['sweep']}', part {report['part']}.",
        "Config: shape, bN batch, cN context (a random prompt of N - new ids, then new greedy tokens: nN, by default "
        "min(128, N / 2); the KV cache holds N positions). Random bf16 weights; one process: every backend on the same "
        "GPU and weights. Latency: per decode step, host wall time, p50/p99 over the steps (torch: p50). "
        "best torch / mk > 1: mk is faster. Floor: the median step's bytes (mk's own weight-only 'bandwidth floor' "
        "line plus the KV cache rows that step reads, prompt + new / 2 per sequence, computed here) at 4.2 TB/s. "
        "Tokens: the first "
        f"{meta['check_sequences']} sequences of each backend against torch eager's up to the first difference; a "
        "difference within eager's bf16 noise is a near-tie (tie), any other fails.", "",
        "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [table_row(row, backends) for row in rows]
    failed = [row["config"] for row in rows if row["status"] != "OK"]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} configs OK" + (f"; not OK: {', '.join(failed)}."
                                                                           if failed else ".")]
    return "\n".join(lines) + "\n"


def write(report: dict, text: str, out: Path | None, name: str) -> str:
    """The report as `name`.json and its markdown `text` as `name`.md in `out` (if given); returns the text."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / f"{name}.md").write_text(text)
    return text


def line_of(row: dict, index: str) -> str:
    if row["status"] != "OK" and "p50_us" not in row.get("mk", {}):
        return f"{index} {row['config']}: {row['status']}: {notes_cell(row)[:200]}; {row['wall_s']:.0f} s"
    mk, best, floor = row["mk"], row.get("best_torch"), row.get("floor", {})
    against = f", best torch {row['torch'][best]['p50_us']:.0f} us ({best}, {row['best_over_mk']:.2f}x)" if best else ""
    problems = f"; {notes_cell(row)[:200]}" if row["status"] != "OK" else ""
    return (f"{index} {row['config']}: {row['status']}, mk p50 {mk['p50_us']:.0f} us{against}, "
            f"{cell(floor.get('mk_percent'), 0)}% of floor, tokens {tokens_cell(row)}{problems}; {row['wall_s']:.0f} s")


def sweep(args) -> int:
    try:
        items = expand(args.sweep, args.new_tokens)
    except ValueError as error:
        raise bd.Fatal(f"--sweep: {error}") from error
    if args.plan:
        return plan(items, args)
    k, n = parse_part(args.part)
    items = partition(items, n, args)[k - 1]
    bd.check_setup(args)
    report = {"meta": {**bd.meta_of(args), "check_sequences": args.check_sequences,
                       "skip_compile_above_batch": args.skip_compile_above_batch},
              "sweep": args.sweep, "part": args.part or "1/1", "rows": []}
    name = "decode-sweep" + (f"-part{args.part.replace('/', 'of')}" if args.part else "")
    begin = time.perf_counter()
    deadline = begin + args.time_budget if args.time_budget else None

    def emit(row: dict) -> None:
        report["rows"].append(row)
        print(line_of(row, f"[{len(report['rows'])}/{len(items)}]"), flush=True)
        write(report, markdown(report), args.out, name)

    for _, group in itertools.groupby(items, key=lambda item: (item.spec.name, item.spec.layers)):
        run_shape(args, list(group), emit, deadline)
    report["wall_s"] = time.perf_counter() - begin
    print(write(report, markdown(report), args.out, name), end="")
    return finish(report)


def finish(report: dict) -> int:
    bad = [row["config"] for row in report["rows"] if row["status"] != "OK"]
    if bad:
        print(f"bench_decode: sweep FAILED: {len(bad)} of {len(report['rows'])} configs not OK: {', '.join(bad)}",
              file=sys.stderr)
    unrun = [row["config"] for row in report["rows"] if row["status"] == "NOT RUN"]
    if unrun:
        print(f"bench_decode: not run (time budget), to run later: --sweep '{';'.join(unrun)}'", file=sys.stderr)
    return 1 if bad else 0


def merge(args) -> int:
    """The parts' reports as one: their rows in order, the first part's meta (each part's in 'parts')."""
    reports = [json.loads(path.read_text()) for path in args.merge]
    report = {"meta": reports[0]["meta"], "sweep": reports[0]["sweep"], "part": "merged",
              "parts": [{"part": r["part"], "meta": r["meta"], "wall_s": r.get("wall_s")} for r in reports],
              "rows": [row for r in reports for row in r["rows"]]}
    print(write(report, markdown(report), args.out, "decode-sweep"), end="")
    return finish(report)


def main(args) -> int:
    return merge(args) if args.merge else sweep(args)
