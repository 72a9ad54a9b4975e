// Static QK attention (RndEmbQK / FixedSeqQK, variants.md section 4): Q and K come from a fixed
// stream, so each head has one causal attention map for every input.
//
//   attnkit::static_attention_map map(q_fixed, k_fixed, opts);   // probabilities stored once
//   map.apply(v, out, pool);                                      // out [B, T, H, Dv]: last T rows
//
// q_fixed [1, Lmax, H, D], k_fixed [1, Lmax, Hk, D], v [B, L, Hk, Dv] with L <= Lmax. Always
// causal; query i of every batch item uses row i of the top-left L x L block.
#pragma once

#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/detail/static_qk/map.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"
