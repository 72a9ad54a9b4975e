// attnkit: header-only CPU attention kernels. The one header to include.
#pragma once

#include "attnkit/version.hpp"
#include "attnkit/config.hpp"
#include "attnkit/view.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "attnkit/reference/gated_mlp.hpp"
#include "attnkit/gated_mlp.hpp"
#include "attnkit/reference/embedding_qk.hpp"
#include "attnkit/embedding_qk.hpp"
