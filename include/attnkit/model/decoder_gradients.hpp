// The gradient of every parameter of a decoder (model/decoder.hpp), shaped like the parameters
// and named like them: decoder::loss_and_gradients writes it, model::adamw reads it.
//
//   attnkit::model::decoder_gradients g(model);       // zeros, one tensor per parameter
//   double loss = model.loss_and_gradients(tokens, targets, batch, g);
//   g.for_each([](const std::string& name, auto& t) { ... });   // the decoder's order and names
//   double norm = g.global_norm();                     // for clipping
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/model/decoder_layer.hpp"

namespace attnkit {
namespace model {

// One layer's gradients: the member names of decoder_layer's weights, so that
// for_each_layer_parameter walks both alike. Tensors of a kind the layer does not have stay
// empty.
struct layer_gradients {
    tensor1 attn_norm, ffn_norm;
    tensor2 wq, wk, wv, wo, mg, mu, md, fg, fu, fd;
    tensor1 bq, bk, bv;
    tensor4 kq_pre;
    tensor2 head_pre, head_post;
    tensor1 group_norm, gate;
};

class decoder_gradients {
   public:
    decoder_gradients() = default;
    // Zero gradients for the parameters of `model` (any class with for_each_parameter,
    // layer_kinds and config, i.e. a decoder).
    template <class Model>
    explicit decoder_gradients(const Model& model)
        : kinds_(model.layer_kinds()),
          bias_(model.config().attention_bias),
          tied_(model.config().tie_word_embeddings),
          layers_(kinds_.size()) {
        // Both walks visit the same names in the same order: the i-th gradient takes the
        // i-th parameter's shape.
        std::vector<std::vector<Eigen::Index>> shapes;
        model.for_each_parameter([&](const std::string&, const auto& w) {
            shapes.emplace_back(w.dimensions().begin(), w.dimensions().end());
        });
        std::size_t i = 0;
        for_each([&](const std::string&, auto& g) {
            typename std::decay_t<decltype(g)>::Dimensions d;
            for (std::size_t r = 0; r < d.size(); ++r) d[r] = shapes[i][r];
            ++i;
            g.resize(d);
            g.setZero();
        });
    }

    const std::vector<attention_variant>& layer_kinds() const { return kinds_; }
    bool attention_bias() const { return bias_; }
    bool tie_word_embeddings() const { return tied_; }
    tensor2& embed() { return embed_; }
    tensor2& lm_head() { return lm_head_; }  // untied only
    tensor1& final_norm() { return final_norm_; }
    layer_gradients& layer(index_t l) { return layers_[static_cast<std::size_t>(l)]; }

    // Every gradient tensor with its parameter's name, in decoder::for_each_parameter's order.
    template <class F>
    void for_each(F&& f) {
        walk(*this, f);
    }
    template <class F>
    void for_each(F&& f) const {
        walk(*this, f);
    }

    // sqrt of the sum of squares of every gradient, summed in double in the fixed parameter
    // order (the same value for any thread count, as the gradients themselves are).
    double global_norm() const {
        double s = 0.0;
        for_each([&](const std::string&, const auto& t) {
            for (index_t i = 0; i < static_cast<index_t>(t.size()); ++i) s += static_cast<double>(t.data()[i]) * t.data()[i];
        });
        return std::sqrt(s);
    }

    void set_zero() {
        for_each([](const std::string&, auto& t) { t.setZero(); });
    }

   private:
    template <class Self, class F>
    static void walk(Self& self, F& f) {
        f(std::string("model.embed_tokens.weight"), self.embed_);
        for (std::size_t l = 0; l < self.layers_.size(); ++l)
            for_each_layer_parameter(self.kinds_[l], self.bias_, static_cast<index_t>(l), self.layers_[l], f);
        f(std::string("model.norm.weight"), self.final_norm_);
        if (!self.tied_) f(std::string("lm_head.weight"), self.lm_head_);
    }

    std::vector<attention_variant> kinds_;
    bool bias_ = false, tied_ = true;
    std::vector<layer_gradients> layers_;
    tensor2 embed_, lm_head_;
    tensor1 final_norm_;
};

}  // namespace model
}  // namespace attnkit
