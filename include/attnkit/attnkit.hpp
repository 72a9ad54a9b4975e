// attnkit: header-only CPU attention kernels. The one header to include: every variant, its
// reference implementation, the backward passes, the model pieces and the decoder template, and
// Eigen's Tensor module.
//
//   #include <attnkit/attnkit.hpp>
//   Eigen::Tensor<float, 4, Eigen::RowMajor> q(1, 6, 2, 8), k(1, 6, 2, 8), v(1, 6, 2, 8), out(1, 6, 2, 8);
//   attnkit::softmax_attention(q, k, v, out);
//
// A file that needs one variant compiles faster with that variant's header alone (which leaves
// the Tensor module to the file that uses Eigen tensors).
#pragma once

#include "attnkit/version.hpp"
#include "attnkit/config.hpp"
#include "attnkit/eigen.hpp"
#include "attnkit/view.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/int8_kv.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention_backward.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "attnkit/taylor_attention.hpp"
#include "attnkit/reference/taylor_attention_backward.hpp"
#include "attnkit/taylor_attention_backward.hpp"
#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/reference/self_gating_attention_backward.hpp"
#include "attnkit/self_gating_attention_backward.hpp"
#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "attnkit/reference/static_qk_attention_backward.hpp"
#include "attnkit/static_qk_attention_backward.hpp"
#include "attnkit/reference/gated_mlp.hpp"
#include "attnkit/gated_mlp.hpp"
#include "attnkit/reference/gated_mlp_backward.hpp"
#include "attnkit/gated_mlp_backward.hpp"
#include "attnkit/reference/embedding_qk.hpp"
#include "attnkit/embedding_qk.hpp"
#include "attnkit/reference/embedding_qk_backward.hpp"
#include "attnkit/embedding_qk_backward.hpp"
#include "attnkit/reference/mta_attention.hpp"
#include "attnkit/mta_attention.hpp"
#include "attnkit/reference/mta_attention_backward.hpp"
#include "attnkit/mta_attention_backward.hpp"
#include "attnkit/varlen_attention.hpp"
#include "attnkit/paged_attention.hpp"
#include "attnkit/reference/varlen_attention.hpp"
#include "attnkit/reference/model/rms_norm.hpp"
#include "attnkit/reference/model/rope.hpp"
#include "attnkit/reference/model/cross_entropy.hpp"
#include "attnkit/model/rms_norm.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/model/cross_entropy.hpp"
#include "attnkit/kv_cache.hpp"
#include "attnkit/distributed_options.hpp"  // distributed.hpp itself needs MPI: include it yourself
#include "attnkit/model/hybrid_schedule.hpp"
#include "attnkit/diagnostics.hpp"
#include "attnkit/model/decoder_config.hpp"
#include "attnkit/model/decoder_layer.hpp"
#include "attnkit/model/decoder.hpp"
