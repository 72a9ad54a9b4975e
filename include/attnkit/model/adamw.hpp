// AdamW (Loshchilov and Hutter: Adam with decoupled weight decay) for the decoder template, with
// a linear warm-up and a constant or cosine learning rate, and clipping by the global norm of
// the gradients, as PyTorch's torch.optim.AdamW + clip_grad_norm_ do it.
//
//   attnkit::model::adamw_options o;   // lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01
//   o.warmup_steps = 100;  o.total_steps = 2000;  o.schedule = attnkit::model::lr_schedule::cosine;
//   attnkit::model::adamw opt(model, o);
//   attnkit::model::decoder_gradients g(model);
//   for (...) { model.loss_and_gradients(tokens, targets, batch, g);  opt.step(model, g); }
//
// Step t (1-based), per element, with lr_t from the schedule and g clipped first:
//   p -= lr_t * weight_decay * p                         (decoupled decay: matrices only, below)
//   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2
//   p -= lr_t * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Weight decay applies to the matrices (embedding, projections, MLPs, MTA's kernels and head
// mixing) and not to the norms' and the gate's vectors: decaying a norm weight pulls it towards
// 0 rather than towards its initial 1 (the convention of GPT-2 / nanoGPT / Hugging Face's
// trainer). Every update is elementwise and the clipping norm a fixed-order double sum, so the
// same gradients give the same parameters bit for bit with any thread count.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/model/decoder.hpp"

namespace attnkit {
namespace model {

enum class lr_schedule {
    constant,  // lr after the warm-up
    cosine,    // from lr after the warm-up down to min_lr_ratio * lr at total_steps, then flat
};

struct adamw_options {
    float lr = 1e-3f;
    float beta1 = 0.9f, beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.01f;
    float clip_norm = 1.0f;   // clip the gradients' global norm to this; 0: no clipping
    index_t warmup_steps = 0;  // lr rises linearly over these steps: lr * t / warmup_steps
    index_t total_steps = 0;   // cosine: the step where the decay ends (> warmup_steps)
    lr_schedule schedule = lr_schedule::constant;
    float min_lr_ratio = 0.1f;  // cosine: the final lr as a fraction of lr
};

inline void check_adamw_options(const adamw_options& o) {
    const auto bad = [](const std::string& what) {
        throw std::invalid_argument("attnkit::model::adamw: " + what);
    };
    if (!(o.lr >= 0.0f) || !std::isfinite(o.lr)) bad("lr must be finite and >= 0, got " + attnkit::detail::number(o.lr));
    if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f) || !(o.beta2 >= 0.0f && o.beta2 < 1.0f))
        bad("beta1 and beta2 must be in [0, 1), got " + attnkit::detail::number(o.beta1) + " and " + attnkit::detail::number(o.beta2));
    if (!(o.eps > 0.0f) || !std::isfinite(o.eps)) bad("eps must be finite and > 0, got " + attnkit::detail::number(o.eps));
    if (!(o.weight_decay >= 0.0f) || !std::isfinite(o.weight_decay))
        bad("weight_decay must be finite and >= 0, got " + attnkit::detail::number(o.weight_decay));
    if (!(o.clip_norm >= 0.0f) || !std::isfinite(o.clip_norm))
        bad("clip_norm must be finite and >= 0 (0: no clipping), got " + attnkit::detail::number(o.clip_norm));
    if (o.warmup_steps < 0) bad("warmup_steps must be >= 0, got " + std::to_string(o.warmup_steps));
    if (o.schedule == lr_schedule::cosine && o.total_steps <= o.warmup_steps)
        bad("cosine schedule: total_steps = " + std::to_string(o.total_steps) + " must exceed warmup_steps = " +
            std::to_string(o.warmup_steps));
    if (!(o.min_lr_ratio >= 0.0f && o.min_lr_ratio <= 1.0f))
        bad("min_lr_ratio must be in [0, 1], got " + attnkit::detail::number(o.min_lr_ratio));
}

class adamw {
   public:
    adamw(const decoder& model, const adamw_options& o = {}) : o_(o) {
        check_adamw_options(o_);
        model.for_each_parameter([&](const std::string& name, const auto& p) {
            names_.push_back(name);
            sizes_.push_back(static_cast<index_t>(p.size()));
            decay_.push_back(p.NumDimensions >= 2);
            m_.emplace_back(static_cast<std::size_t>(p.size()), 0.0f);
            v_.emplace_back(static_cast<std::size_t>(p.size()), 0.0f);
        });
    }

    const adamw_options& options() const { return o_; }
    index_t steps() const { return t_; }

    // The learning rate of step t (1-based): what step() uses next for t = steps() + 1.
    double learning_rate(index_t t) const {
        const double lr = o_.lr;
        if (o_.warmup_steps > 0 && t <= o_.warmup_steps) return lr * static_cast<double>(t) / o_.warmup_steps;
        if (o_.schedule == lr_schedule::constant) return lr;
        const double span = static_cast<double>(o_.total_steps - o_.warmup_steps);
        const double p = std::min(1.0, static_cast<double>(t - o_.warmup_steps) / span);
        const double lo = lr * o_.min_lr_ratio;
        return lo + 0.5 * (lr - lo) * (1.0 + std::cos(3.141592653589793 * p));
    }

    // Clips g (in place) to clip_norm, applies one step to the model's parameters and calls
    // model.parameters_changed(). Returns the gradients' global norm before clipping. Checks
    // that model and g have the parameters this optimizer was built for before changing
    // anything.
    double step(decoder& model, decoder_gradients& g) {
        check_matches(model, g);
        const double norm = g.global_norm();
        // PyTorch's clip_grad_norm_: scale by clip / (norm + 1e-6) when that is below 1. A
        // non-finite norm is left to the update (it poisons the parameters it reaches, as in
        // PyTorch without error_if_nonfinite).
        float clip = 1.0f;
        if (o_.clip_norm > 0.0f && std::isfinite(norm) && norm > o_.clip_norm)
            clip = static_cast<float>(o_.clip_norm / (norm + 1e-6));
        ++t_;
        const double lr = learning_rate(t_);
        const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(o_.beta1), static_cast<double>(t_)));
        const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(o_.beta2), static_cast<double>(t_)));
        const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps, flr = static_cast<float>(lr);
        const float inv_bc1 = 1.0f / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
        std::vector<float*> grads;
        g.for_each([&](const std::string&, auto& t) { grads.push_back(t.data()); });
        std::size_t i = 0;
        model.for_each_parameter([&](const std::string&, auto& p) {
            const std::size_t k = i++;
            float* w = p.data();
            const float* gr = grads[k];
            float* m = m_[k].data();
            float* v = v_[k].data();
            const float decay = decay_[k] ? 1.0f - flr * o_.weight_decay : 1.0f;
            const index_t n = sizes_[k];
            // Elementwise: any split over threads gives the same bits.
            constexpr index_t kChunk = 1 << 14;
            parallel_for(model.config().pool, (n + kChunk - 1) / kChunk, [&](index_t c) {
                const index_t e = std::min(n, (c + 1) * kChunk);
                for (index_t j = c * kChunk; j < e; ++j) {
                    const float gj = gr[j] * clip;
                    m[j] = b1 * m[j] + (1.0f - b1) * gj;
                    v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
                    const float denom = std::sqrt(v[j]) * inv_sqrt_bc2 + eps;
                    w[j] = w[j] * decay - flr * (m[j] * inv_bc1) / denom;
                }
            });
        });
        if (clip != 1.0f) g.for_each([&](const std::string&, auto& t) {
            for (index_t j = 0; j < static_cast<index_t>(t.size()); ++j) t.data()[j] *= clip;
        });
        model.parameters_changed();
        return norm;
    }

   private:
    void check_matches(const decoder& model, const decoder_gradients& g) const {
        std::size_t i = 0;
        bool ok = true;
        const auto same = [&](const std::string& name, const auto& t) {
            ok = ok && i < names_.size() && names_[i] == name && sizes_[i] == static_cast<index_t>(t.size());
            ++i;
        };
        model.for_each_parameter(same);
        ok = ok && i == names_.size();
        i = 0;
        g.for_each(same);
        ok = ok && i == names_.size();
        if (!ok)
            throw std::invalid_argument(
                "attnkit::model::adamw::step: model and gradients must have the parameters (names and sizes) of the "
                "decoder the optimizer was built for");
    }

    adamw_options o_;
    index_t t_ = 0;
    std::vector<std::string> names_;
    std::vector<index_t> sizes_;
    std::vector<bool> decay_;
    std::vector<std::vector<float>> m_, v_;
};

}  // namespace model
}  // namespace attnkit
