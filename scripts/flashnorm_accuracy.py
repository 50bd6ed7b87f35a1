#!/usr/bin/env python3
"""RMSNorm then a GEMM, two ways in bf16, against the exact result: how accurate FlashNorm's folding would be.

- unfused (mk today): normed = bf16(x * inv_rms * g), then normed @ W^T with fp32 accumulation, rounded to bf16;
- folded (FlashNorm, arXiv 2407.09577): W' = bf16(W * g) once at load time, then x @ W'^T with fp32 accumulation,
  scaled by inv_rms in the epilogue and rounded to bf16.

Both are compared with float64 arithmetic on the same bf16 inputs (x, g, W), for norm weights near 1 (random-weight
models) and spread over two decades (trained Llama checkpoints), with and without outlier channels in x.
Usage: scripts/flashnorm_accuracy.py [--rows 256] [--d-model 2048] [--n 1024] [--seed 0]
"""
import argparse

import numpy as np


def bf16(values):
    """Round to the nearest bf16 (ties to even), kept in float32."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def errors(result, exact):
    """Relative L2 error and the largest absolute error of result against exact."""
    diff = result.astype(np.float64) - exact
    return float(np.linalg.norm(diff) / np.linalg.norm(exact)), float(np.abs(diff).max())


def compare(x, g, w, eps=1e-5):
    """Errors against float64 of unfused and folded, in fp32 then rounded to bf16; x (rows, d), g (d), w (n, d) bf16."""
    x64, g64, w64 = x.astype(np.float64), g.astype(np.float64), w.astype(np.float64)
    inv_rms64 = 1.0 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps)
    exact = (x64 * inv_rms64 * g64) @ w64.T  # (rows, n)
    inv_rms = (1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True, dtype=np.float32) + np.float32(eps))).astype(np.float32)
    normed = bf16(x * inv_rms * g)                              # (rows, d)
    unfused = normed @ w.T                                      # (rows, n), fp32 accumulation
    folded = (x @ bf16(w * g[None, :]).T) * inv_rms             # (rows, n)
    return [errors(result, exact) for result in (unfused, folded, bf16(unfused), bf16(folded))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random = np.random.default_rng(args.seed)
    w = bf16(random.normal(0.0, 0.02, (args.n, args.d_model)))
    norm_weights = {
        "g ~ 1 +- 0.1": bf16(random.normal(1.0, 0.1, args.d_model)),
        "g log-uniform 0.02..2": bf16(np.exp(random.uniform(np.log(0.02), np.log(2.0), args.d_model))),
    }
    channel_scale = np.ones(args.d_model, dtype=np.float32)
    channel_scale[random.choice(args.d_model, 8, replace=False)] = 30.0
    inputs = {
        "x ~ N(0, 1)": bf16(random.normal(0.0, 1.0, (args.rows, args.d_model))),
        "x with 8 outlier channels (x30)": bf16(random.normal(0.0, 1.0, (args.rows, args.d_model)) * channel_scale),
    }
    print("rel L2 error (max abs error) against float64; fp32: the GEMM's result before the output's bf16 rounding")
    print("| x | g | unfused fp32 | folded fp32 | unfused bf16 out | folded bf16 out |")
    print("|---|---|---|---|---|---|")
    for x_name, x in inputs.items():
        for g_name, g in norm_weights.items():
            cells = " | ".join(f"{l2:.2e} ({worst:.1e})" for l2, worst in compare(x, g, w))
            print(f"| {x_name} | {g_name} | {cells} |")


if __name__ == "__main__":
    main()
