"""Checks mk's engines against Hugging Face transformers' LlamaForCausalLM: logits of two small random models."""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

BATCH, SEQ_LEN = 3, 200
SEED = 20240601
ENGINES = ("reference", "cpu-vm", "gpu")
# The project's policy: an engine may be at most twice as far from HF fp32 as HF's own bf16 run is, plus slack.
# The reference engine computes in fp32 over the same bf16 weights, so it must match HF fp32 almost exactly:
# that is what checks the loader and the reference model themselves.
BF16_FACTOR, SLACK, REFERENCE_TOL = 2.0, 4e-3, 1e-4


class Failure(Exception):
    """Something that makes the comparison itself meaningless (exit status 2)."""


class EngineError(Exception):
    """One mk engine run that failed; the other engines and configs still run."""


@dataclass
class Spec:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    rms_norm_eps: float
    tied: bool
    rope: dict  # spelled as transformers 5's rope_parameters


SPECS = [
    Spec("A", 256, 512, 2, 4, 2, 64, 1024, 2048, 1e-5, False,
         {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
    # heads * head_dim != hidden and an eps unlike A's, so a loader that assumes either is caught. 4096 positions
    # rather than LlamaConfig's default 2048, which transformers might leave out of config.json (mk requires it).
    Spec("B", 512, 1280, 3, 8, 2, 128, 2048, 4096, 1e-6, True, {"rope_type": "default", "rope_theta": 10000.0}),
]


def expected_inv_freq(rope, head_dim):
    """RoPE inverse frequencies written out from their definitions (llama3: Llama 3.1's band-wise scaling)."""
    freqs = [rope["rope_theta"] ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]
    if rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        context = rope["original_max_position_embeddings"]
        scaled = []
        for freq in freqs:
            wavelength = 2 * math.pi / freq
            if wavelength < context / high:
                scaled.append(freq)
            elif wavelength > context / low:
                scaled.append(freq / factor)
            else:
                smooth = (context / wavelength - low) / (high - low)
                scaled.append((1 - smooth) * freq / factor + smooth * freq)
        freqs = scaled
    return torch.tensor(freqs, dtype=torch.float64)


def inv_freq_mismatch(rotary, spec):
    """None if the RoPE frequencies of `rotary` (a model's rotary_emb, or one built from a config) are the intended
    ones, else what differs."""
    actual = getattr(rotary, "inv_freq", None)
    if actual is None:
        return "rotary_emb.inv_freq not found, so the RoPE transformers applies cannot be confirmed"
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected_inv_freq(spec.rope, spec.head_dim)
    # transformers computes them in fp32: a few ulp of pow() is fine, a wrong scaling band is not.
    if actual.shape == expected.shape and torch.allclose(actual, expected, rtol=1e-5, atol=0):
        return None
    worst = (actual - expected).abs().div(expected).max().item() if actual.shape == expected.shape else math.inf
    return f"RoPE inverse frequencies differ from the intended {spec.rope} (worst relative error {worst:.3g})"


def rope_as_mk_reads(config_json):
    """The RoPE settings mk's config.json parser (src/host/model_config.cc) derives, spelled as rope_parameters."""
    scaling = next((config_json[key] for key in ("rope_parameters", "rope_scaling")
                    if isinstance(config_json.get(key), dict)), None)
    theta = config_json.get("rope_theta")
    theta = 10000.0 if theta is None else theta
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    if scaling.get("rope_theta") is not None:
        theta = scaling["rope_theta"]
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    rope = {"rope_type": kind, "rope_theta": theta}
    if kind == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            rope[key] = scaling.get(key)
    return rope


def check_config_json(config_json, spec):
    """Fails unless mk, reading this config.json with its own defaults, sees exactly the intended model."""
    heads = config_json.get("num_attention_heads")
    hidden = config_json.get("hidden_size")
    mk_view = {
        "hidden_size": hidden,
        "intermediate_size": config_json.get("intermediate_size"),
        "num_hidden_layers": config_json.get("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": config_json.get("num_key_value_heads") or heads,
        "head_dim": config_json.get("head_dim") or (hidden // heads if hidden and heads else None),
        "vocab_size": config_json.get("vocab_size"),
        "max_position_embeddings": config_json.get("max_position_embeddings"),
        "rms_norm_eps": config_json.get("rms_norm_eps", 1e-6),
        "tie_word_embeddings": config_json.get("tie_word_embeddings", False),
        "rope": rope_as_mk_reads(config_json),
    }
    intended = {
        "hidden_size": spec.hidden, "intermediate_size": spec.intermediate, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
        "vocab_size": spec.vocab, "max_position_embeddings": spec.max_positions, "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tied, "rope": spec.rope,
    }
    wrong = [f"{key}: mk would read {mk_view[key]!r}, intended {value!r}"
             for key, value in intended.items() if mk_view[key] != value]
    if wrong:
        raise Failure(f"config {spec.name}: config.json does not describe the intended model:\n  " + "\n  ".join(wrong))


def build_config(spec, overrides=None):
    """A LlamaConfig that transformers really turns into the intended RoPE; returns (config, how it was spelled).
    overrides: further LlamaConfig arguments (say the special token ids)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    common = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                  num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                  head_dim=spec.head_dim, max_position_embeddings=spec.max_positions, rms_norm_eps=spec.rms_norm_eps,
                  tie_word_embeddings=spec.tied, hidden_act="silu", attention_bias=False, mlp_bias=False,
                  **(overrides or {}))
    scaling = {key: value for key, value in spec.rope.items() if key != "rope_theta"}
    if spec.rope["rope_type"] == "default":
        scaling = None
    attempts = [
        ("rope_parameters (transformers 5)", {"rope_parameters": dict(spec.rope)}),
        ("rope_theta + rope_scaling (transformers 4)",
         {"rope_theta": spec.rope["rope_theta"], "rope_scaling": scaling}),
    ]
    problems = []
    for label, rope_kwargs in attempts:
        try:
            config = LlamaConfig(**common, **rope_kwargs)
        except (TypeError, ValueError, KeyError) as error:
            problems.append(f"{label}: {type(error).__name__}: {error}")
            continue
        # transformers 4 keeps an unknown rope_parameters as a plain attribute and ignores it, so only the
        # frequencies of the rotary embedding built from the config prove which spelling took effect (its module
        # alone: a whole model would be 32 GB of fp32 at 8B).
        mismatch = inv_freq_mismatch(LlamaRotaryEmbedding(config=config), spec)
        if mismatch is None:
            return config, label
        problems.append(f"{label}: {mismatch}")
    raise Failure(f"config {spec.name}: no way of passing RoPE to LlamaConfig worked:\n  " + "\n  ".join(problems))


def build_and_save(spec, directory, overrides=None, device="cpu"):
    """Saves a random bf16 model to directory, initialized on `device` (the GPU initializes a large one fast);
    returns (config spelling, its state dict on the CPU, config.json)."""
    from transformers import LlamaForCausalLM

    config, label = build_config(spec, overrides)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if tied != spec.tied:
        raise Failure(f"config {spec.name}: LM head {'is' if tied else 'is not'} tied to the embedding, "
                      f"intended tie_word_embeddings={spec.tied}")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim != 1:
                continue
            if "norm" not in name:
                raise Failure(f"config {spec.name}: unexpected 1-D parameter {name} (a bias?)")
            # Norm weights start at one, which would hide a loader that drops or misplaces them.
            parameter.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(directory))
    if not (directory / "model.safetensors").exists() and not (directory / "model.safetensors.index.json").exists():
        raise Failure(f"config {spec.name}: save_pretrained wrote no safetensors to {directory}: "
                      f"{sorted(p.name for p in directory.iterdir())}")
    text = (directory / "config.json").read_text()
    print(f"config {spec.name}: LlamaConfig given {label}; config.json written:\n{text}", flush=True)
    config_json = json.loads(text)
    check_config_json(config_json, spec)
    saved = {name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()}
    return label, saved, config_json


def load_hf(directory, dtype, device="cuda", attention="eager"):
    from transformers import LlamaForCausalLM

    # transformers 5 calls the argument `dtype`; older 4.x only knows `torch_dtype` and may silently ignore `dtype`.
    for key in ("dtype", "torch_dtype"):
        try:
            model = LlamaForCausalLM.from_pretrained(str(directory), attn_implementation=attention, **{key: dtype})
        except TypeError:
            continue
        if all(parameter.dtype == dtype for parameter in model.parameters()):
            return model.to(device).eval()
    raise Failure(f"{directory}: transformers did not load the model as {dtype} (tried dtype= and torch_dtype=)")


def hf_logits(directory, dtype, tokens, saved, spec):
    model = load_hf(directory, dtype)
    state = model.state_dict()
    for name, tensor in saved.items():
        loaded = state.get(name)
        if loaded is None or loaded.shape != tensor.shape or not torch.equal(loaded.to("cpu", torch.bfloat16), tensor):
            raise Failure(f"config {spec.name}: {name} as loaded ({dtype}) differs from the saved weights: "
                          "transformers dropped or re-initialized it")
    if dtype == torch.float32:
        # Checked on the fp32 load only: that is the model whose RoPE the reference engine must match.
        mismatch = inv_freq_mismatch(getattr(model.model, "rotary_emb", None), spec)
        if mismatch is not None:
            raise Failure(f"config {spec.name}: model loaded from config.json: {mismatch}")
    with torch.no_grad():
        logits = model(input_ids=tokens.to("cuda"), use_cache=False).logits.float().cpu()
    del model
    torch.cuda.empty_cache()
    if logits.shape != (BATCH, SEQ_LEN, spec.vocab) or not torch.isfinite(logits).all():
        raise Failure(f"config {spec.name}: HF {dtype} logits have shape {tuple(logits.shape)} or are not finite")
    return logits


def tail(text, lines=30):
    return "\n".join(text.strip().splitlines()[-lines:])


def run_engine(mk, engine, directory, input_path, timeout, spec):
    output = directory / f"out_{engine}.safetensors"
    output.unlink(missing_ok=True)  # a stale file must not pass for this run's output
    command = [str(mk), "run", "--model", str(directory), "--input", str(input_path), "--output", str(output),
               "--engine", engine]
    print("$ " + " ".join(command), flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineError(f"mk timed out after {timeout} s") from None
    if result.returncode != 0:
        raise EngineError(f"mk exited with status {result.returncode}:\n{tail(result.stderr + result.stdout)}")
    if not output.exists():
        raise EngineError(f"mk exited 0 but wrote no {output}")
    from safetensors.torch import load_file

    tensors = load_file(str(output))
    logits = tensors.get("logits")
    if logits is None:
        raise EngineError(f"{output} has no tensor 'logits' (has {sorted(tensors)})")
    if logits.dtype != torch.float32 or logits.shape != (BATCH, SEQ_LEN, spec.vocab):
        raise EngineError(f"{output}: 'logits' is {logits.dtype} {tuple(logits.shape)}, "
                          f"expected float32 {(BATCH, SEQ_LEN, spec.vocab)}")
    return logits


def errors(values, reference):
    finite = bool(torch.isfinite(values).all())
    if not finite:  # NaN would poison the norms and, worse, compare as "not greater than" a tolerance
        return {"finite": False, "rel_l2": None, "max_abs": None}
    diff = values.double() - reference.double()
    return {"finite": True, "rel_l2": (diff.norm() / reference.double().norm()).item(),
            "max_abs": diff.abs().max().item()}


def number(value):
    return "-" if value is None else f"{value:.3e}"


def print_table(rows):
    print(f"\n{'config':<6} {'engine':<10} {'rel L2':>10} {'max abs':>10} {'bf16 rel L2':>11} {'allowed':>10}  result")
    for row in rows:
        result = "PASS" if row["passed"] else ("ERROR" if "error" in row else "FAIL" if row["finite"] else "FAIL (NaN)")
        print(f"{row['config']:<6} {row['engine']:<10} {number(row.get('rel_l2')):>10} "
              f"{number(row.get('max_abs')):>10} {number(row['bf16_rel_l2']):>11} {number(row['allowed']):>10}  "
              f"{result}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mk", required=True, type=Path, help="the mk binary")
    parser.add_argument("--work", required=True, type=Path,
                        help="scratch directory; its hf-A/ and hf-B/ subdirectories are replaced")
    parser.add_argument("--engines", default="reference,gpu", help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per mk run")
    args = parser.parse_args()
    args.engines = [engine for engine in args.engines.split(",") if engine]
    unknown = [engine for engine in args.engines if engine not in ENGINES]
    if unknown or not args.engines:
        parser.error(f"--engines: unknown or empty {unknown} (known: {', '.join(ENGINES)})")
    return args


def main():
    args = parse_args()
    mk = args.mk.resolve()
    if not mk.is_file() or not os.access(mk, os.X_OK):
        raise Failure(f"--mk {args.mk}: not an executable file")
    if not torch.cuda.is_available():
        raise Failure("CUDA is not available to torch; the HF references run on the GPU")
    # TF32 matmuls would put the "fp32" reference ~1e-3 away from the truth, far beyond REFERENCE_TOL.
    torch.set_float32_matmul_precision("highest")
    import transformers
    from safetensors.torch import save_file

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}, "
          f"mk {mk}", flush=True)
    rows, configs = [], {}
    for spec in SPECS:
        directory = args.work / f"hf-{spec.name}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        label, saved, config_json = build_and_save(spec, directory)
        tokens = torch.randint(0, spec.vocab, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(SEED + 1))
        input_path = directory / "input.safetensors"
        save_file({"tokens": tokens.to(torch.int32).contiguous()}, str(input_path))

        logits32 = hf_logits(directory, torch.float32, tokens, saved, spec)
        logits16 = hf_logits(directory, torch.bfloat16, tokens, saved, spec)
        save_file({"logits_fp32": logits32, "logits_bf16": logits16}, str(directory / "hf_logits.safetensors"))
        bf16 = errors(logits16, logits32)
        print(f"config {spec.name}: HF bf16 vs HF fp32: rel L2 {bf16['rel_l2']:.3e}, max abs {bf16['max_abs']:.3e} "
              f"(|logits| max {logits32.abs().max().item():.3f})", flush=True)
        configs[spec.name] = {"spec": asdict(spec), "hf_config_kwargs": label, "config_json": config_json,
                              "hf_bf16": bf16}

        allowed = BF16_FACTOR * bf16["rel_l2"] + SLACK
        for engine in args.engines:
            row = {"config": spec.name, "engine": engine, "bf16_rel_l2": bf16["rel_l2"],
                   "allowed": min(allowed, REFERENCE_TOL) if engine == "reference" else allowed}
            try:
                row.update(errors(run_engine(mk, engine, directory, input_path, args.timeout, spec), logits32))
                row["passed"] = row["finite"] and row["rel_l2"] <= row["allowed"]
            except EngineError as error:
                row.update(finite=False, error=str(error), passed=False)
                print(f"config {spec.name}, engine {engine}: {error}", flush=True)
            rows.append(row)
            print(f"config {spec.name}, engine {engine}: rel L2 {number(row.get('rel_l2'))}, "
                  f"max abs {number(row.get('max_abs'))}, allowed {row['allowed']:.3e}: "
                  f"{'PASS' if row['passed'] else 'FAIL'}", flush=True)

    passed = all(row["passed"] for row in rows)
    report = {"passed": passed, "batch": BATCH, "seq_len": SEQ_LEN, "seed": SEED,
              "policy": {"bf16_factor": BF16_FACTOR, "slack": SLACK, "reference_tol": REFERENCE_TOL},
              "torch": torch.__version__, "transformers": transformers.__version__,
              "device": torch.cuda.get_device_name(), "configs": configs, "results": rows}
    (args.work / "hf_compare.json").write_text(json.dumps(report, indent=1) + "\n")
    print_table(rows)
    print(f"wrote {args.work / 'hf_compare.json'}")
    if not passed:
        failed = [f"{row['config']}/{row['engine']}" for row in rows if not row["passed"]]
        print(f"compare_hf: FAILED: {', '.join(failed)}")
        return 1
    print("compare_hf: all engines within tolerance")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as failure:
        print(f"compare_hf: error: {failure}", file=sys.stderr)
        sys.exit(2)
