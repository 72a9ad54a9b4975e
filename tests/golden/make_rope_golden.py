#!/usr/bin/python3
"""Golden values for attnkit::model::rope in Hugging Face's convention, computed without attnkit.

Plain Python (`math` only, no torch), from transformers' modeling_rope_utils and modeling code:
  - inv_freq of rope_type "default", "linear", "llama3" (_compute_llama3_parameters) and
    "yarn" (_compute_yarn_parameters, with its attention_factor / get_mscale), over the rotary
    dim R = int(head_dim * partial_rotary_factor) or an explicit rotary dim;
  - apply_rotary_pos_emb: cos = cat(freqs, freqs).cos() * attention_scaling (sin likewise),
    q_embed = q * cos + rotate_half(q) * sin on the first R elements, the rest passed through
    (the partial-rotary models: GPT-NeoX, Phi, StableLM);
  - GPT-J's interleaved form: rotate_every_two(x) = stack(-x[..., 1::2], x[..., ::2]) flattened,
    cos / sin repeat_interleave(2) (Meta's Llama reference code, GGUF).
Everything is computed in double; transformers computes inv_freq and the angles in float32, which
differs from these values by up to ~1e-2 radians at positions near 1e5 (the C++ kernel follows
the formulas in double, as here).

Inputs are exact binary fractions (input() below, mirrored by rope_golden::input in the header),
so the C++ test feeds the kernel exactly the values used here.

Regenerate (from the repository root):
    /usr/bin/python3 tests/golden/make_rope_golden.py > tests/golden/rope_golden.hpp
"""
import math


def input_value(case_index, row, d):
    return ((case_index * 17 + row * 131 + d * 37) % 97 - 48) / 16.0


# ---- inv_freq, as transformers' modeling_rope_utils ----

def default_inv_freq(base, dim):
    return [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]


def linear_inv_freq(base, dim, factor):
    return [f / factor for f in default_inv_freq(base, dim)]


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for inv in default_inv_freq(base, dim):
        wavelen = 2 * math.pi / inv
        llama = inv / factor if wavelen > low_freq_wavelen else inv
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        is_medium = not (wavelen < high_freq_wavelen) and not (wavelen > low_freq_wavelen)
        out.append(smoothed if is_medium else llama)
    return out


def get_mscale(scale, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_params(base, dim, factor, original_max, beta_fast=32, beta_slow=1, mscale=None, mscale_all_dim=None,
                attention_factor=None, truncate=True):
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def find_correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = find_correction_dim(beta_fast)
    high = find_correction_dim(beta_slow)
    if truncate:
        low = math.floor(low)
        high = math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = [base ** (i / dim) for i in range(0, dim, 2)]
    out = []
    for j, pf in enumerate(pos_freqs):
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        extrapolation_factor = 1 - ramp
        out.append((1.0 / (factor * pf)) * (1 - extrapolation_factor) + (1.0 / pf) * extrapolation_factor)
    return out, attention_factor


# ---- application ----

def rotate_half(x):
    h = len(x) // 2
    return [-v for v in x[h:]] + x[:h]


def rotate_every_two(x):
    out = []
    for c in range(len(x) // 2):
        out += [-x[2 * c + 1], x[2 * c]]
    return out


def apply_neox(x, position, inv_freq, scaling):
    rot, rest = x[:2 * len(inv_freq)], x[2 * len(inv_freq):]
    freqs = [position * f for f in inv_freq]
    emb = freqs + freqs  # torch.cat((freqs, freqs), dim=-1)
    cos = [math.cos(a) * scaling for a in emb]
    sin = [math.sin(a) * scaling for a in emb]
    r = rotate_half(rot)
    return [rot[i] * cos[i] + r[i] * sin[i] for i in range(len(rot))] + rest


def apply_gptj(x, position, inv_freq, scaling):
    rot, rest = x[:2 * len(inv_freq)], x[2 * len(inv_freq):]
    freqs = [position * f for f in inv_freq]
    cos = [math.cos(a) * scaling for a in freqs for _ in range(2)]  # repeat_interleave(2)
    sin = [math.sin(a) * scaling for a in freqs for _ in range(2)]
    r = rotate_every_two(rot)
    return [rot[i] * cos[i] + r[i] * sin[i] for i in range(len(rot))] + rest


# name, style, rope_type, theta, head_dim, rotary_dim, scaling dict, positions
CASES = [
    ("default_neox", "rotate_half", "default", 10000.0, 8, 8, {}, [0, 1, 7, 1000]),
    ("qwen2_default", "rotate_half", "default", 1000000.0, 64, 64, {}, [0, 3, 4095, 32767]),
    ("linear_neox", "rotate_half", "linear", 10000.0, 16, 16, {"factor": 2.0}, [0, 5, 2047, 9000]),
    ("llama31_neox", "rotate_half", "llama3", 500000.0, 128, 128,
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     [0, 5, 8191, 131071]),
    ("llama31_gptj", "interleaved", "llama3", 500000.0, 64, 64,
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     [1, 17, 12000]),
    ("yarn_qwen", "rotate_half", "yarn", 1000000.0, 64, 64,
     {"factor": 4.0, "original_max_position_embeddings": 32768}, [0, 3, 40000, 131000]),
    ("yarn_mscale", "rotate_half", "yarn", 10000.0, 32, 32,
     {"factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
      "mscale": 1.0, "mscale_all_dim": 0.707}, [2, 60000]),
    ("yarn_no_truncate", "interleaved", "yarn", 150000.0, 64, 64,
     {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
      "truncate": False}, [9, 100000]),
    ("neox_partial_quarter", "rotate_half", "default", 10000.0, 32, 8, {}, [0, 2, 513]),
    ("gptj_partial", "interleaved", "default", 10000.0, 24, 16, {}, [1, 64, 2049]),
]


def inv_freq_of(rope_type, theta, rdim, s):
    if rope_type == "default":
        return default_inv_freq(theta, rdim), 1.0
    if rope_type == "linear":
        return linear_inv_freq(theta, rdim, s["factor"]), 1.0
    if rope_type == "llama3":
        return llama3_inv_freq(theta, rdim, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                               s["original_max_position_embeddings"]), 1.0
    return yarn_params(theta, rdim, s["factor"], s["original_max_position_embeddings"], s.get("beta_fast", 32),
                       s.get("beta_slow", 1), s.get("mscale"), s.get("mscale_all_dim"), s.get("attention_factor"),
                       s.get("truncate", True))


def main():
    print("// Generated by tests/golden/make_rope_golden.py (Hugging Face's RoPE conventions in plain Python,")
    print("// double); do not edit. Regenerate from the repository root with")
    print("//   /usr/bin/python3 tests/golden/make_rope_golden.py > tests/golden/rope_golden.hpp")
    print("#pragma once\n")
    print("namespace rope_golden {\n")
    print("// Input element d of row `row` of case `case_index`: an exact binary fraction.")
    print("inline double input(int case_index, int row, int d) {")
    print("    return static_cast<double>((case_index * 17 + row * 131 + d * 37) % 97 - 48) / 16.0;")
    print("}\n")
    print("struct golden_case {")
    print("    const char* name;")
    print("    const char* style;      // rotate_half or interleaved")
    print("    const char* rope_type;  // default, linear, llama3, yarn")
    print("    double theta;")
    print("    int head_dim, rotary_dim;")
    print("    double factor, low_freq_factor, high_freq_factor;")
    print("    long long original_max_position_embeddings;")
    print("    double beta_fast, beta_slow, mscale, mscale_all_dim;")
    print("    bool truncate;")
    print("    int rows;")
    print("    long long positions[4];")
    print("    double expected[4 * 128];  // rows x head_dim")
    print("};\n")
    print("inline const golden_case kCases[] = {")
    for ci, (name, style, rope_type, theta, head_dim, rdim, s, positions) in enumerate(CASES):
        inv, scaling = inv_freq_of(rope_type, theta, rdim, s)
        apply = apply_neox if style == "rotate_half" else apply_gptj
        expected = []
        for row, p in enumerate(positions):
            x = [input_value(ci, row, d) for d in range(head_dim)]
            expected += apply(x, p, inv, scaling)
        pos = ", ".join(str(p) for p in positions)
        vals = ",\n      ".join(", ".join(repr(v) for v in expected[i:i + 4]) for i in range(0, len(expected), 4))
        print(f'    {{"{name}", "{style}", "{rope_type}", {theta!r}, {head_dim}, {rdim}, '
              f'{float(s.get("factor", 1.0))!r}, {float(s.get("low_freq_factor", 1.0))!r}, '
              f'{float(s.get("high_freq_factor", 4.0))!r}, {int(s.get("original_max_position_embeddings", 0))}, '
              f'{float(s.get("beta_fast", 32.0))!r}, {float(s.get("beta_slow", 1.0))!r}, '
              f'{float(s.get("mscale") or 0.0)!r}, {float(s.get("mscale_all_dim") or 0.0)!r}, '
              f'{"true" if s.get("truncate", True) else "false"}, {len(positions)},')
        print(f"     {{{pos}}},")
        print(f"     {{{vals}}}}},")
    print("};\n")
    print("}  // namespace rope_golden")


if __name__ == "__main__":
    main()
