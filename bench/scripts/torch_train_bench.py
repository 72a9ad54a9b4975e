#!/usr/bin/python3
"""The decoder template's training step in PyTorch (CPU), for the throughput comparison with
bench/decoder_training_bench.cpp's standard-attention rows: the same model (Qwen2.5-shaped
pre-norm decoder: tied embedding, RMSNorm, q/k/v/o projections without bias, rotate-half RoPE
with theta 1e6, causal softmax attention, SwiGLU of width ffn_width(d)), the same batch, the same
optimizer (AdamW lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices, clipping
at global norm 1). Attention is torch's own: scaled_dot_product_attention where torch has it
(2.0+), else the materialised softmax(QK^T / sqrt(D) + causal mask) V that torch 1.13's models
use.

    /usr/bin/python3 torch_train_bench.py [--threads N] [--steps N] [--shape 70m|mqar]

Prints one JSON object: shape, threads, torch version, tokens/s (median over the timed steps).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# Debian's torch calls BLAS through the generic libblas.so.3 interface: with OpenBLAS behind it
# (libopenblas0-*), BLAS runs its own threads, which torch.set_num_threads does not reach. Pin
# them before torch loads the library, so that "1 thread" means one core.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = threads_from_argv()

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print(json.dumps({"error": "torch not installed (Debian: python3-torch)"}))
    sys.exit(0)

SHAPES = {  # d_model, layers, heads, vocab, L, batch: as in decoder_training_bench.cpp
    "70m": (512, 6, 8, 512, 512, 4),
    "mqar": (64, 2, 4, 64, 24, 32),
}


def ffn_width(d):
    return (8 * d // 3 + 63) // 64 * 64


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(L, D, theta):
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h, self.D = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, d, bias=False)
        self.v = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        f = ffn_width(d)
        self.g = torch.nn.Linear(d, f, bias=False)
        self.u = torch.nn.Linear(d, f, bias=False)
        self.dn = torch.nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, L, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, L, self.h, self.D).transpose(1, 2)
        k = self.k(h).view(B, L, self.h, self.D).transpose(1, 2)
        v = self.v(h).view(B, L, self.h, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(self.D) + mask
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(B, L, d))
        h = self.n2(x)
        return x + self.dn(F.silu(self.g(h)) * self.u(h))


class Decoder(torch.nn.Module):
    def __init__(self, d, layers, heads, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([Layer(d, heads) for _ in range(layers)])
        self.norm = RMSNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tokens, cos, sin, mask):
        x = self.emb(tokens)
        for l in self.layers:
            x = l(x, cos, sin, mask)
        return self.norm(x) @ self.emb.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--shape", default="70m", choices=sorted(SHAPES))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, layers, heads, vocab, L, B = SHAPES[a.shape]
    model = Decoder(d, layers, heads, vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    cos, sin = rope_tables(L, d // heads, 1e6)
    mask = torch.full((L, L), float("-inf")).triu(1)
    tokens = torch.randint(0, vocab, (B, L))
    targets = torch.randint(0, vocab, (B, L))
    times = []
    for step in range(a.steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        logits = model(tokens, cos, sin, mask)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - t0)
    # The BLAS library the process actually mapped (Debian's alternatives or LD_LIBRARY_PATH
    # decide: the reference BLAS of libblas3 unless an optimised one is installed).
    blas = "unknown"
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "blas" in line and line.split()[-1].startswith("/")})
        blas = ", ".join(libs) if libs else blas
    except OSError:
        pass
    print(json.dumps({"blas": blas, "shape": a.shape, "d_model": d, "layers": layers, "heads": heads, "vocab": vocab, "L": L,
                      "batch": B, "threads": a.threads, "torch": torch.__version__,
                      "tokens_per_s": B * L / statistics.median(times), "steps": a.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
