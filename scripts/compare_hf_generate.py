"""Checks that `mk generate` makes Hugging Face transformers' greedy tokens: generate(do_sample=False) in bf16.

Two random-weight LlamaForCausalLM models (compare_hf.py's specs, saved by save_pretrained as bf16 safetensors with
config.json and generation_config.json) generate --new-tokens (64) greedy tokens per sequence in Hugging Face's bf16
and with `mk generate --engine reference` and `--engine cpu-vm` (and `--engine gpu` with --engines); the token
sequences are compared.
  B: GQA (8 query heads over 2 kv heads), tied embeddings, one sequence;
  A: GQA (4 over 2), untied, llama3 RoPE; a ragged batch of 4 prompts (23, 1, 14 and 6 tokens), left-padded for
     Hugging Face (with its attention mask), given to mk with their lengths.
Neither model has an EOS id, so every sequence runs the full count (both sides are checked to agree on that).

Near-ties: policy (b), per-step logits against a measured noise bound, rather than (a) weights scaled until the
logits are peaked. HF's bf16 run rounds every op, so where two logits nearly tie its token is a coin toss that a
correct fp32 engine need not reproduce. Scaling does not make those ties go away: bf16's error is relative and
grows with the logits as the margins do, and logits peaked enough to beat it come from weights that turn the model
into a lookup table (the current token picks the next), whose tokens loop after a few steps and exercise little of
attention. Measuring the noise keeps the comparison at every step where it means something, and proves why a step
it excuses may differ. At each step, on HF's own tokens:
  - l16: HF's bf16 logits from generate; l32: the HF fp32 model's on the same tokens (teacher-forced); e = l16 - l32;
  - delta = max |mk - l32|, mk's logits from `mk run --engine reference` on the same tokens (mk's incremental decode
    gives its full-sequence forward's logits bit for bit: docs/decode.md); they must also pass the tolerance
    policy (the reference within compare_hf.REFERENCE_TOL relative L2 of fp32);
  - for HF's token t and every other token j: HF's margin l16[t] - l16[j] against its noise |e[t] - e[j]| + 2 delta.
    A margin above its noise means l32[t] - l32[j] > 2 delta, so no engine within delta of fp32 prefers j. mk's
    token must be t unless it is a j whose margin is within its noise (a near-tie); any other token fails (exit 1).
  - the gpu engine (bf16 activations, far more than the reference's delta from fp32) is held to the same rule with
    its own delta, from `mk run --engine gpu` on the same tokens. Its decode steps compute the same model with the
    same bf16 roundings through other kernels, so that delta estimates theirs; tests/gpu/test_gpu_decode.cc checks
    decode against the forward pass under the tolerance policy.
After a near-tie divergence mk has left HF's path, so it is run again from the prompt plus HF's tokens up to and
including that step, and the comparison goes on: every new token is compared once. The reference and the cpu-vm
must also agree with each other (they are bit-identical by design). If more than a quarter of the steps were
near-ties the comparison would prove little, and it stops with exit status 2. The models use transformers'
initialization with a wider initializer_range (CONFIG says why).

Runs on the CPU (torch, transformers and safetensors installed; CI has none of them, so it is not part of ctest):
  python3 scripts/compare_hf_generate.py --mk build/mk --work /tmp/hfgen
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_hf  # noqa: E402  (the model specs, building, saving and loading, the tolerance constants)
from compare_hf import EngineError, Failure  # noqa: E402

ENGINES = ("reference", "cpu-vm", "gpu")
BIT_IDENTICAL = ("reference", "cpu-vm")  # by design; the gpu is held to HF the same way, not to them
SEED = 20240602
MAX_NEAR_TIE_SHARE = 0.25
# Hugging Face's bf16 logits stay within a few percent of fp32 on these models (compare_hf measures ~1e-2); far
# more means its generate did not compute the intended model (padding or positions), and the bound would be vacuous.
HF_BF16_SANE_REL_L2 = 0.1
# No EOS anywhere: both sides generate the full count, and each side's view of the EOS ids is checked below.
SPECIAL_TOKENS = {"bos_token_id": 1, "eos_token_id": None, "pad_token_id": None}
# transformers' initialization, wider than its default 0.02: at 0.02 the layers barely steer the next token and
# greedy sequences fall into a loop of a few tokens (3 distinct of 64 on B), so most steps would test the same
# thing; at 0.05 they make 20-55 distinct tokens of 64, with HF's bf16 still within ~2% of fp32.
CONFIG = {**SPECIAL_TOKENS, "initializer_range": 0.05}
PAD_ID = 0


@dataclass
class Case:
    spec: compare_hf.Spec
    prompt_lengths: list


CASES = [
    Case(next(spec for spec in compare_hf.SPECS if spec.name == "B"), [17]),
    Case(next(spec for spec in compare_hf.SPECS if spec.name == "A"), [23, 1, 14, 6]),
]


@dataclass
class Reference:
    """Hugging Face's greedy run of one case, and what each step's token is held to."""
    prompts: list
    tokens: list          # per sequence, HF's new tokens
    margin: torch.Tensor  # (batch, steps, vocab): HF's bf16 logit of its token minus each token's (inf at its own)
    noise: torch.Tensor   # (batch, steps, vocab): the bf16 noise on that margin, plus mk's distance from fp32
    stats: dict = field(default_factory=dict)
    # Engines whose own distance from fp32 differs from `mk run --engine reference`'s (the gpu: bf16 activations):
    # their noise, with their delta measured the same way on the same tokens.
    engine_noise: dict = field(default_factory=dict)

    def noise_of(self, engine):
        return self.engine_noise.get(engine, self.noise)

    def contested(self):
        """(batch, steps): steps where some rival's margin is within the noise: HF's token is not guaranteed."""
        return (self.margin <= self.noise).any(dim=-1)


def mk_eos_view(directory):
    """The EOS ids `mk generate` takes from a model directory (src/generate/generate.cc, model_eos_ids)."""
    for name in ("generation_config.json", "config.json"):
        path = directory / name
        if not path.exists():
            continue
        eos = json.loads(path.read_text()).get("eos_token_id")
        if eos is not None:
            return sorted(eos if isinstance(eos, list) else [eos])
    return []


def save_model(spec, directory, config=CONFIG, device="cpu"):
    """A random bf16 model by save_pretrained (initialized on `device`), with a generation_config.json that mk and HF
    read alike, loaded back on the CPU (transformers' eager attention). config: LlamaConfig arguments,
    SPECIAL_TOKENS among them."""
    from transformers import GenerationConfig

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    compare_hf.build_and_save(spec, directory, config, device)
    if not (directory / "generation_config.json").exists():
        GenerationConfig(**SPECIAL_TOKENS).save_pretrained(str(directory))
    model = compare_hf.load_hf(directory, torch.bfloat16, device="cpu")
    hf_eos = model.generation_config.eos_token_id
    hf_eos = sorted(hf_eos if isinstance(hf_eos, list) else [] if hf_eos is None else [hf_eos])
    if hf_eos != mk_eos_view(directory):
        raise Failure(f"{directory}: HF stops at EOS ids {hf_eos}, mk would stop at {mk_eos_view(directory)}")
    return model


def hf_generate(model, prompts, new_tokens):
    """HF's greedy tokens and raw per-step logits (batch, steps, vocab), prompts left-padded as HF batches them."""
    longest = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, longest - len(prompt):] = torch.tensor(prompt)
        mask[b, longest - len(prompt):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                             pad_token_id=PAD_ID, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[:, longest:]
    if tokens.shape != (len(prompts), new_tokens) or len(out.logits) != new_tokens:
        raise Failure(f"HF generated {tuple(tokens.shape)} tokens with {len(out.logits)} steps of logits, "
                      f"expected {new_tokens} per sequence")
    logits = torch.stack([step.float() for step in out.logits], dim=1)
    if not torch.equal(logits.argmax(dim=-1), tokens):
        raise Failure("HF's greedy tokens are not the argmax of its own logits")
    return tokens.tolist(), logits


def teacher_forced(model, prompt, new, new_tokens):
    """Logits (steps, vocab) of the model run on prompt + new at the positions that predict each new token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + new], device=model.device), use_cache=False).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + new_tokens]


def mk_logits(mk, directory, sequence, new_tokens, prompt_length, timeout, engine="reference"):
    """mk's logits over one whole sequence (`mk run`), at the positions that predict each new token."""
    from safetensors.torch import load_file, save_file

    input_path, output = directory / "teacher.safetensors", directory / "teacher_logits.safetensors"
    output.unlink(missing_ok=True)
    save_file({"tokens": torch.tensor([sequence], dtype=torch.int32)}, str(input_path))
    run_mk([mk, "run", "--model", directory, "--input", input_path, "--output", output, "--engine", engine], timeout)
    logits = load_file(str(output))["logits"][0]
    return logits[prompt_length - 1:prompt_length - 1 + new_tokens]


def run_mk(command, timeout, echo=True):
    command = [str(part) for part in command]
    if echo:
        print("$ " + " ".join(command), flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineError(f"mk timed out after {timeout} s") from None
    if result.returncode != 0:
        raise EngineError(f"mk exited with status {result.returncode}:\n{compare_hf.tail(result.stderr + result.stdout)}")
    return result.stdout


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def margins_and_noise(bf16, fp32, ours):
    """Per step and token j (steps, vocab): HF's bf16 margin l16[t] - l16[j] of its token t over j, and the noise
    on it, |e[t] - e[j]| + 2 delta, e = l16 - l32 the bf16 error on the same tokens, delta = max |mk - l32|."""
    delta = (ours.double() - fp32.double()).abs().max(dim=-1, keepdim=True).values
    margin, noise = margins_within(bf16, fp32, delta)
    return margin, noise, delta.max().item()


def margins_within(bf16, fp32, delta):
    """margins_and_noise for an engine known only to stay within delta (steps, 1) of fp32 at each step."""
    bf16, fp32 = bf16.double(), fp32.double()
    top = bf16.argmax(dim=-1, keepdim=True)
    error = bf16 - fp32
    margin = (bf16.gather(1, top) - bf16).scatter(1, top, float("inf"))
    return margin, (error.gather(1, top) - error).abs() + 2 * delta.double()


def build_reference(mk, case, directory, new_tokens, timeout, engines=()):
    """HF's bf16 greedy run, the fp32 and mk logits on its tokens, and each step's margins and their noise (with
    delta from the reference engine, and for each of `engines` not bit-identical to it, from that engine)."""
    spec = case.spec
    generator = torch.Generator().manual_seed(SEED)
    prompts = [torch.randint(0, spec.vocab, (n,), generator=generator).tolist() for n in case.prompt_lengths]
    model16 = save_model(spec, directory)
    tokens, logits16 = hf_generate(model16, prompts, new_tokens)
    del model16
    model32 = compare_hf.load_hf(directory, torch.float32, device="cpu")
    margins, noises = [], []
    others = [engine for engine in engines if engine not in BIT_IDENTICAL]
    other_noises = {engine: [] for engine in others}
    stats = {"hf_bf16_rel_l2": [], "mk_rel_l2": [], "delta_max": 0.0, "distinct_new_tokens": []}
    for b, prompt in enumerate(prompts):
        fp32 = teacher_forced(model32, prompt, tokens[b], new_tokens)
        ours = mk_logits(mk, directory, prompt + tokens[b], new_tokens, len(prompt), timeout)
        if not torch.isfinite(ours).all():
            raise EngineError(f"mk run's logits of sequence {b} are not finite")
        margin, noise, delta = margins_and_noise(logits16[b], fp32, ours)
        margins.append(margin)
        noises.append(noise)
        for engine in others:
            theirs = mk_logits(mk, directory, prompt + tokens[b], new_tokens, len(prompt), timeout, engine)
            _, their_noise, their_delta = margins_and_noise(logits16[b], fp32, theirs)
            other_noises[engine].append(their_noise)
            stats[f"delta_max_{engine}"] = max(stats.get(f"delta_max_{engine}", 0.0), their_delta)
        stats["hf_bf16_rel_l2"].append(rel_l2(logits16[b], fp32))
        stats["mk_rel_l2"].append(rel_l2(ours, fp32))
        stats["delta_max"] = max(stats["delta_max"], delta)
        stats["distinct_new_tokens"].append(len(set(tokens[b])))
    if max(stats["hf_bf16_rel_l2"]) > HF_BF16_SANE_REL_L2:
        raise Failure(f"config {spec.name}: HF's bf16 generate is {max(stats['hf_bf16_rel_l2']):.3g} (rel L2) from "
                      "its fp32 model on the same tokens: not the same model (padding? positions?)")
    reference = Reference(prompts, tokens, torch.stack(margins), torch.stack(noises), stats,
                          {engine: torch.stack(noise) for engine, noise in other_noises.items()})
    stats["contested_steps"] = [torch.nonzero(row).flatten().tolist() for row in reference.contested()]
    stats["logit_abs_max"] = logits16.abs().max().item()
    return reference


def mk_generate(mk, engine, directory, prompts, new_tokens, timeout):
    """The new tokens `mk generate` makes for each prompt (a ragged batch, through a tokens file with lengths)."""
    from safetensors.torch import load_file, save_file

    longest = max(len(prompt) for prompt in prompts)
    tokens = torch.full((len(prompts), longest), PAD_ID, dtype=torch.int32)
    for b, prompt in enumerate(prompts):
        tokens[b, :len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
    input_path, output = directory / "prompts.safetensors", directory / f"generated_{engine}.safetensors"
    output.unlink(missing_ok=True)
    save_file({"tokens": tokens, "lengths": torch.tensor([len(p) for p in prompts], dtype=torch.int32)},
              str(input_path))
    run_mk([mk, "generate", "--model", directory, "--tokens", input_path, "--max-new-tokens", new_tokens,
            "--engine", engine, "--output", output], timeout)
    saved = load_file(str(output))
    made = []
    for b, prompt in enumerate(prompts):
        sequence = saved["tokens"][b, :saved["lengths"][b]].tolist()
        if sequence[:len(prompt)] != prompt or len(sequence) != len(prompt) + new_tokens:
            raise EngineError(f"mk's sequence {b} is not its prompt plus {new_tokens} new tokens: {sequence}")
        made.append(sequence[len(prompt):])
    return made


def first_difference(reference, b, tokens, start=0, engine="reference"):
    """Sequence b's tokens, made from step `start` on, against the reference's: (steps compared, None) if they all
    match, else (steps up to and including the first difference, that step's entry). The entry's margin is the
    reference's over the token made; at or below its noise (the engine's) the difference is a near-tie, else a
    mismatch."""
    noise_of_engine = reference.noise_of(engine)
    for step in range(start, min(len(reference.tokens[b]), start + len(tokens))):
        got, want = tokens[step - start], reference.tokens[b][step]
        if got != want:
            margin, noise = reference.margin[b, step, got].item(), noise_of_engine[b, step, got].item()
            return step - start + 1, {"sequence": b, "step": step, "mk": got, "hf": want, "margin": margin,
                                      "noise": noise}
    return min(len(reference.tokens[b]) - start, len(tokens)), None


def compare_engine(mk, engine, directory, reference, new_tokens, timeout):
    """mk's tokens against HF's, restarting from HF's path after each near-tie divergence."""
    batch = len(reference.prompts)
    start, pending = [0] * batch, list(range(batch))
    result = {"compared": 0, "matched": 0, "near_tie_divergences": [], "mismatches": [], "mk_runs": [],
              "first_run": None}
    while pending:
        prompts = [reference.prompts[b] + reference.tokens[b][:start[b]] for b in pending]
        made = mk_generate(mk, engine, directory, prompts, new_tokens - min(start[b] for b in pending), timeout)
        result["mk_runs"].append({"sequences": pending, "from_step": [start[b] for b in pending], "tokens": made})
        if result["first_run"] is None:
            result["first_run"] = made
        still = []
        for b, tokens in zip(pending, made):
            compared, entry = first_difference(reference, b, tokens, start[b], engine)
            result["compared"] += compared
            result["matched"] += compared - (entry is not None)
            if entry is None:
                continue
            if entry["margin"] <= entry["noise"]:
                result["near_tie_divergences"].append(entry)
                start[b] = entry["step"] + 1
                still += [b] if start[b] < new_tokens else []
            else:
                result["mismatches"].append(entry)
        pending = still
    return result


def check_case(mk, case, work, engines, new_tokens, timeout):
    spec = case.spec
    directory = work / f"gen-{spec.name}"
    reference = build_reference(mk, case, directory, new_tokens, timeout, engines)
    stats = reference.stats
    steps, contested = len(reference.prompts) * new_tokens, int(reference.contested().sum())
    print(f"config {spec.name}: HF bf16 vs fp32 rel L2 {max(stats['hf_bf16_rel_l2']):.3e}, mk vs fp32 rel L2 "
          f"{max(stats['mk_rel_l2']):.3e} (delta max {stats['delta_max']:.3e}, |logits| max "
          f"{stats['logit_abs_max']:.3f}); distinct new tokens per sequence {stats['distinct_new_tokens']}; "
          f"near-tie steps {contested} of {steps}", flush=True)
    if contested > MAX_NEAR_TIE_SHARE * steps:
        raise Failure(f"config {spec.name}: {contested} of {steps} steps are near-ties; the comparison would prove "
                      "little")
    logits_ok = max(stats["mk_rel_l2"]) <= compare_hf.REFERENCE_TOL
    rows = []
    for engine in engines:
        row = {"config": spec.name, "engine": engine, "batch": len(reference.prompts),
               "prompt_lengths": case.prompt_lengths, "logits_ok": logits_ok}
        try:
            row.update(compare_engine(mk, engine, directory, reference, new_tokens, timeout))
        except EngineError as error:
            row.update(error=str(error))
            print(f"config {spec.name}, engine {engine}: {error}", flush=True)
        row["passed"] = "error" not in row and logits_ok and not row["mismatches"]
        rows.append(row)
    firsts = [row.get("first_run") for row in rows if row["engine"] in BIT_IDENTICAL]
    if len(firsts) > 1 and any(first != firsts[0] for first in firsts):
        for row in rows:
            if row["engine"] in BIT_IDENTICAL:
                row["passed"] = False
                row["engines_disagree"] = True
    report = {"spec": asdict(spec), "prompts": reference.prompts, "hf_tokens": reference.tokens,
              "stats": stats}
    return rows, report


def print_table(rows):
    print(f"\n{'config':<6} {'engine':<10} {'batch':>5} {'prompts':<16} {'compared':>8} {'matched':>7} "
          f"{'near-tie':>8} {'mismatch':>8} {'mk runs':>7}  result")
    for row in rows:
        result = "PASS" if row["passed"] else "ERROR" if "error" in row else "FAIL"
        print(f"{row['config']:<6} {row['engine']:<10} {row['batch']:>5} "
              f"{','.join(map(str, row['prompt_lengths'])):<16} {row.get('compared', 0):>8} "
              f"{row.get('matched', 0):>7} {len(row.get('near_tie_divergences', [])):>8} "
              f"{len(row.get('mismatches', [])):>8} {len(row.get('mk_runs', [])):>7}  {result}")
        for entry in row.get("near_tie_divergences", []) + row.get("mismatches", []):
            kind = "near-tie" if entry["margin"] <= entry["noise"] else "MISMATCH"
            print(f"    {kind}: sequence {entry['sequence']} step {entry['step']}: mk {entry['mk']}, HF {entry['hf']}; "
                  f"HF's margin over mk's token {entry['margin']:.4g}, its noise {entry['noise']:.4g}")
        if row.get("engines_disagree"):
            print("    the engines' tokens differ from each other (reference and cpu-vm are bit-identical by design)")
        if not row["logits_ok"]:
            print(f"    mk's logits are farther than {compare_hf.REFERENCE_TOL} (rel L2) from HF fp32")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mk", required=True, type=Path, help="the mk binary")
    parser.add_argument("--work", required=True, type=Path, help="scratch directory; its gen-*/ subdirectories are "
                        "replaced")
    parser.add_argument("--engines", default=",".join(BIT_IDENTICAL),
                        help=f"comma-separated, of {', '.join(ENGINES)} (default: the cpu engines)")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per sequence")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per mk run")
    args = parser.parse_args()
    args.engines = [engine for engine in args.engines.split(",") if engine]
    if not args.engines or any(engine not in ENGINES for engine in args.engines):
        parser.error(f"--engines: {args.engines} (known: {', '.join(ENGINES)})")
    if args.new_tokens < 1:
        parser.error("--new-tokens must be at least 1")
    return args


def main():
    args = parse_args()
    mk = args.mk.resolve()
    if not mk.is_file() or not os.access(mk, os.X_OK):
        raise Failure(f"--mk {args.mk}: not an executable file")
    torch.set_float32_matmul_precision("highest")
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, CPU, mk {mk}", flush=True)
    rows, reports = [], {}
    for case in CASES:
        case_rows, reports[case.spec.name] = check_case(mk, case, args.work, args.engines, args.new_tokens,
                                                        args.timeout)
        rows += case_rows
    passed = all(row["passed"] for row in rows)
    summary = {"passed": passed, "new_tokens": args.new_tokens, "seed": SEED, "torch": torch.__version__,
               "transformers": transformers.__version__, "cases": reports,
               "results": [{key: value for key, value in row.items() if key != "first_run"} for row in rows]}
    (args.work / "hf_generate_compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_table(rows)
    print(f"wrote {args.work / 'hf_generate_compare.json'}")
    if not passed:
        print("compare_hf_generate: FAILED")
        return 1
    print("compare_hf_generate: every token identical to HF's wherever its margin exceeds the bf16 noise")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as failure:
        print(f"compare_hf_generate: error: {failure}", file=sys.stderr)
        sys.exit(2)
