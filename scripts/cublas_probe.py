"""Runs one bf16 GEMM shape through cuBLAS (torch F.linear) a few times, for Nsight Compute to compare with mk."""
import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("m", type=int, help="token rows")
parser.add_argument("n", type=int, help="output columns (weight rows)")
parser.add_argument("k", type=int, help="reduction length")
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()
a = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)  # (M, K)
w = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)  # (N, K)
for _ in range(args.repeats):
    out = F.linear(a, w)  # (M, N)
torch.cuda.synchronize()
