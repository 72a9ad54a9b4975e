#!/usr/bin/python3
"""Tiny Hugging Face checkpoints and their logits, computed without attnkit.

Writes two checkpoint directories (config.json + model.safetensors) and the logits of a fixed token
sequence through each, from an independent numpy forward of transformers' Qwen2 / Llama
definitions (modeling_qwen2.py, modeling_llama.py):
  - x = embed_tokens[tokens];
  - per layer: h = RMSNorm(x) = x / sqrt(mean(x^2) + eps) * weight;
    q, k, v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv) (nn.Linear, weights [out, in]);
    RoPE: inv_freq = 1 / theta^(arange(0, D, 2) / D), emb = cat(freqs, freqs),
    q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1);
    GQA: query head h reads key/value head h // (H / Hk) (repeat_kv);
    softmax(q k^T / sqrt(D) + causal mask) v, then o_proj; x += that;
    x += down(silu(gate(RMSNorm(x))) * up(RMSNorm(x)));
  - logits = RMSNorm(x) lm_head^T, lm_head = embed_tokens when tie_word_embeddings.
  checkpoint_qwen2: model_type qwen2 (q/k/v biases), tied head, weights stored as BF16.
  checkpoint_llama: model_type llama (no biases, head_dim given), untied lm_head, stored as F32.
The forward runs in float64 on the stored values (BF16 rounded to nearest even, as torch rounds),
so the only difference to attnkit's float forward is float rounding.

The safetensors files are written with struct and json as the format specifies: an 8-byte
little-endian header length, the JSON header (padded with spaces to a multiple of 8), the data;
tensors sorted by name as safetensors' serializer orders them of one dtype.

Weights come from a splitmix64 generator in plain Python (the same values on any machine and numpy
version). Regenerate (from the repository root):
    /usr/bin/python3 tests/golden/make_checkpoint_golden.py > tests/golden/checkpoint_golden.hpp
which also rewrites tests/golden/checkpoint_qwen2/ and tests/golden/checkpoint_llama/.
"""
import json
import os
import struct

# One BLAS thread: a threaded BLAS splits the sums of a product differently from run to run, and
# the regenerated header would differ in the last digits.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402 (after the thread settings, which BLAS reads when it loads)

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, MAX_POS = 37, 32, 2, 4, 2, 48, 64
HEAD_DIM = HIDDEN // HEADS
TOKENS = [(i * 7 + 3) % VOCAB for i in range(12)]
MASK64 = (1 << 64) - 1


class Rng:
    """splitmix64; uniform() in (-1, 1)."""

    def __init__(self, seed):
        self.s = seed & MASK64

    def next64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self, shape, scale):
        n = int(np.prod(shape))
        vals = [((self.next64() >> 11) + 0.5) / 2.0 ** 53 * 2.0 - 1.0 for _ in range(n)]
        return (np.array(vals, dtype=np.float64) * scale).astype(np.float32).reshape(shape)


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even (torch's .to(torch.bfloat16))."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_value(a):
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def make_weights(seed, bias, tied):
    """Hugging Face names and layouts ([out, in] for every Linear), float32."""
    r = Rng(seed)
    w = {"model.embed_tokens.weight": r.uniform((VOCAB, HIDDEN), 1.0)}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1.0 + r.uniform((HIDDEN,), 0.2)
        # q and k larger than v: scores of several units, so that attention is far from uniform.
        w[p + "self_attn.q_proj.weight"] = r.uniform((HEADS * HEAD_DIM, HIDDEN), 0.6)
        w[p + "self_attn.k_proj.weight"] = r.uniform((KV_HEADS * HEAD_DIM, HIDDEN), 0.6)
        w[p + "self_attn.v_proj.weight"] = r.uniform((KV_HEADS * HEAD_DIM, HIDDEN), 0.3)
        w[p + "self_attn.o_proj.weight"] = r.uniform((HIDDEN, HEADS * HEAD_DIM), 0.3)
        if bias:
            w[p + "self_attn.q_proj.bias"] = r.uniform((HEADS * HEAD_DIM,), 1.0)
            w[p + "self_attn.k_proj.bias"] = r.uniform((KV_HEADS * HEAD_DIM,), 1.0)
            w[p + "self_attn.v_proj.bias"] = r.uniform((KV_HEADS * HEAD_DIM,), 0.5)
        w[p + "post_attention_layernorm.weight"] = 1.0 + r.uniform((HIDDEN,), 0.2)
        w[p + "mlp.gate_proj.weight"] = r.uniform((INTER, HIDDEN), 0.3)
        w[p + "mlp.up_proj.weight"] = r.uniform((INTER, HIDDEN), 0.3)
        w[p + "mlp.down_proj.weight"] = r.uniform((HIDDEN, INTER), 0.25)
    w["model.norm.weight"] = 1.0 + r.uniform((HIDDEN,), 0.2)
    if not tied:
        w["lm_head.weight"] = r.uniform((VOCAB, HIDDEN), 0.5)
    return w


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(w, tokens, theta, eps, bias, tied):
    """transformers' forward in float64: logits [L, vocab]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    L = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    inv_freq = 1.0 / theta ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    freqs = np.outer(np.arange(L, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    causal = np.tril(np.ones((L, L), dtype=bool))
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if bias:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(L, HEADS, HEAD_DIM)
        k = k.reshape(L, KV_HEADS, HEAD_DIM)
        v = v.reshape(L, KV_HEADS, HEAD_DIM)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = np.zeros((L, HEADS, HEAD_DIM))
        for hh in range(HEADS):
            kv = hh // (HEADS // KV_HEADS)
            s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(HEAD_DIM)
            s = np.where(causal, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            att[:, hh, :] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        x = x + att.reshape(L, HEADS * HEAD_DIM) @ w[p + "self_attn.o_proj.weight"].T
        h2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h2 @ w[p + "mlp.gate_proj.weight"].T
        u = h2 @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    xf = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return xf @ head.T


def write_safetensors(path, weights, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(weights):
        a = weights[name]
        data = to_bf16_bits(a).astype("<u2").tobytes() if dtype == "BF16" else a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def common_config(theta, eps, tied):
    return {"attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": INTER,
            "max_position_embeddings": MAX_POS, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
            "num_key_value_heads": KV_HEADS, "rms_norm_eps": eps, "rope_scaling": None, "rope_theta": theta,
            "tie_word_embeddings": tied, "transformers_version": "4.45.0", "use_cache": True,
            "vocab_size": VOCAB}


MODELS = [
    # dir, seed, model_type, bias, tied, dtype, rope_theta, rms_norm_eps
    ("checkpoint_qwen2", 101, "qwen2", True, True, "BF16", 10000.0, 1e-6),
    ("checkpoint_llama", 202, "llama", False, False, "F32", 100.0, 1e-5),
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    print("// Generated by tests/golden/make_checkpoint_golden.py (transformers' Qwen2 / Llama forward in")
    print("// numpy, float64, on the stored weights); do not edit. Regenerate from the repository root with")
    print("//   /usr/bin/python3 tests/golden/make_checkpoint_golden.py > tests/golden/checkpoint_golden.hpp")
    print("// which also rewrites the checkpoint directories beside this file.")
    print("#pragma once\n")
    print("namespace checkpoint_golden {\n")
    print(f"constexpr int kVocab = {VOCAB}, kLength = {len(TOKENS)};")
    print(f"inline const int kTokens[kLength] = {{{', '.join(str(t) for t in TOKENS)}}};\n")
    print("struct golden_model {")
    print("    const char* dir;    // under tests/golden/")
    print("    const char* dtype;  // of the stored weights")
    print("    double logits[kLength * kVocab];  // [L, vocab], row-major")
    print("};\n")
    print("inline const golden_model kModels[] = {")
    for d, seed, model_type, bias, tied, dtype, theta, eps in MODELS:
        w = make_weights(seed, bias, tied)
        if dtype == "BF16":
            w = {k: bf16_value(v) for k, v in w.items()}
        out = os.path.join(here, d)
        os.makedirs(out, exist_ok=True)
        write_safetensors(os.path.join(out, "model.safetensors"), w, dtype)
        cfg = common_config(theta, eps, tied)
        if model_type == "qwen2":
            cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_window_layers": LAYERS,
                        "sliding_window": MAX_POS, "use_sliding_window": False, "torch_dtype": "bfloat16"})
        else:
            cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                        "head_dim": HEAD_DIM, "mlp_bias": False, "pretraining_tp": 1, "torch_dtype": "float32"})
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(dict(sorted(cfg.items())), f, indent=2)
            f.write("\n")
        logits = forward(w, TOKENS, theta, eps, bias, tied).reshape(-1)
        vals = ",\n      ".join(", ".join(repr(float(v)) for v in logits[i:i + 4]) for i in range(0, len(logits), 4))
        print(f'    {{"{d}", "{dtype}",')
        print(f"     {{{vals}}}}},")
    print("};\n")
    print("}  // namespace checkpoint_golden")


if __name__ == "__main__":
    main()
