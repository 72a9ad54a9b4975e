// attnkit consumer smoke test: uses attnkit the way a downstream project does, through the
// umbrella header only, and checks that a small softmax attention gives finite output.
#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstdio>

#include <unsupported/Eigen/CXX11/Tensor>

int main() {
    using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
    // [batch, seq, heads, dim]
    tensor4 q(1, 4, 2, 8);
    tensor4 k(1, 6, 2, 8);
    tensor4 v(1, 6, 2, 8);
    tensor4 out(1, 4, 2, 8), ref(1, 4, 2, 8);
    for (Eigen::Index i = 0; i < q.size(); ++i) q.data()[i] = std::sin(0.37f * float(i));
    for (Eigen::Index i = 0; i < k.size(); ++i) k.data()[i] = std::cos(0.23f * float(i));
    for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = std::sin(0.11f * float(i) + 1.0f);
    out.setConstant(-42.0f);

    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.pool = &pool;
    attnkit::softmax_attention(q, k, v, out, opts);
    attnkit::reference::softmax_attention(q, k, v, ref, opts);

    std::printf("attnkit %d.%d.%d (ATTNKIT_VERSION %d)\n", ATTNKIT_VERSION_MAJOR,
                ATTNKIT_VERSION_MINOR, ATTNKIT_VERSION_PATCH, ATTNKIT_VERSION);
    bool ok = true;
    for (Eigen::Index i = 0; i < out.dimension(1); ++i) {
        for (Eigen::Index h = 0; h < out.dimension(2); ++h) {
            std::printf("out[0,%d,%d,:] =", int(i), int(h));
            for (Eigen::Index d = 0; d < out.dimension(3); ++d) {
                const float x = out(0, i, h, d);
                std::printf(" %+.5f", double(x));
                // Each output is a convex combination of values in [-1, 1].
                if (!std::isfinite(x) || std::fabs(x) > 1.0f + 1e-5f) ok = false;
                if (std::fabs(x - ref(0, i, h, d)) > 1e-5f) ok = false;  // the oracle agrees
            }
            std::printf("\n");
        }
    }
    std::printf(ok ? "consumer: OK\n" : "consumer: FAILED (non-finite, out-of-range or unlike the reference)\n");
    return ok ? 0 : 1;
}
