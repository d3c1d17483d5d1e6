// A C++ runner over offgraph_kv.hpp in the upstream step protocol: one
// sequence in a okv::KvSequenceCache, the demo's model (examples/runner/)
// prefilling its prompt in chunks and then decoding greedily.
//
// Each step: admission with begin_step (it commits the step and returns its
// first position), then per layer plan (where the rows go, what is read, the
// mask) and update + attend. When a forward fails part-way, the runner
// rewinds the cache to the length before the step and runs the step again.
// `--fail-at M` simulates that at decode step M: the first attempt writes
// corrupted K/V rows into the first half of the layers and then fails, so
// the tokens only come out right if the rewind and the retry really restore
// the step. It prints `generated: [[...]]`, the same list the Rust and C
// runners print for --seqs 1 (with --dtype float32).
//
// The pools are float16 by default (`--dtype` picks float32, bfloat16 or
// q8_0). `--restore-at M` saves the conversation before decode step M, drops
// the cache, and continues from a new cache that loads the snapshot: the
// tokens are those of the uninterrupted run.
//
//   c++ -std=c++17 -O2 -ffp-contract=off -I bindings/c/include -I examples/c
//       examples/cpp/runner.cpp -L target/release -loffgraph_kv_c -o runner-cpp
#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "offgraph_kv.hpp"
extern "C" {
#include "demo_model.h"
}

namespace {

struct SimulatedFailure : std::runtime_error {
    SimulatedFailure() : std::runtime_error("simulated failure in the forward pass") {}
};

struct Runner {
    const dm_args &a;
    const dm_weights &w;
    okv::KvSequenceCache cache;
    okv_attend_options opts{0.0f, 0, OKV_BACKEND_AUTO};
    std::vector<float> x, h, tmp, q, k, v, o, proj;
    std::size_t ring_wraps = 0;

    static okv::Config config(const dm_args &a, okv::Dtype dtype) {
        std::size_t capacity = a.prefix + a.decode;
        okv::Config cfg(capacity, a.layers);
        std::vector<okv_layer_config> layers;
        for (std::size_t i = 0; i < a.layers; i++)
            layers.push_back(dm_is_flat(i) ? okv::flat(a.kv_heads, a.head_dim)
                                           : okv::ring(a.window, a.kv_heads, a.head_dim));
        cfg.layers(layers).max_step(std::min(a.chunk, capacity)).initial_capacity(std::min<std::size_t>(capacity, 64));
        cfg.dtype(dtype);
        return cfg;
    }

    okv::Dtype dtype;

    Runner(const dm_args &args, const dm_weights &weights, okv::Dtype dt)
        : a(args), w(weights), cache(config(args, dt)), dtype(dt) {
        std::size_t t = a.chunk, widest = std::max(a.hidden, a.q_heads * a.head_dim);
        x.resize(t * a.hidden);
        h.resize(t * a.hidden);
        proj.resize(t * a.hidden);
        tmp.resize(t * widest);
        q.resize(t * a.q_heads * a.head_dim);
        o.resize(q.size());
        k.resize(t * a.kv_heads * a.head_dim);
        v.resize(k.size());
        opts.threads = a.threads;
    }

    // One step through every layer; x holds [t, hidden] after the last one.
    // With `fail`, corrupts the rows of the first half of the layers and throws.
    void forward(const std::vector<std::size_t> &tokens, bool fail) {
        const std::size_t t = tokens.size(), hd = a.hidden;
        const std::size_t qd = a.q_heads * a.head_dim, kd = a.kv_heads * a.head_dim;
        const std::size_t position = cache.begin_step(t);  // admission: commits the step
        for (std::size_t i = 0; i < t; i++) std::memcpy(&x[i * hd], w.emb + tokens[i] * hd, hd * sizeof(float));
        for (std::size_t layer = 0; layer < a.layers; layer++) {
            const okv_seq_plan plan = cache.plan(layer);
            if (plan.position != position || plan.n_tokens != t) throw std::logic_error("plan disagrees with the step");
            ring_wraps += plan.n_write == 2;
            dm_rms_norm(x.data(), t, hd, h.data());
            dm_matmul(h.data(), t, hd, w.wk[layer], kd, tmp.data());
            dm_heads(tmp.data(), t, a.kv_heads, a.head_dim, k.data());
            dm_matmul(h.data(), t, hd, w.wv[layer], kd, tmp.data());
            dm_heads(tmp.data(), t, a.kv_heads, a.head_dim, v.data());
            dm_matmul(h.data(), t, hd, w.wq[layer], qd, tmp.data());
            dm_heads(tmp.data(), t, a.q_heads, a.head_dim, q.data());
            if (fail)
                for (auto &e : k) e = -e * 3.0f;
            cache.update(layer, okv::span<const float>(k.data(), t * kd), okv::span<const float>(v.data(), t * kd));
            if (fail && layer + 1 >= (a.layers + 1) / 2) throw SimulatedFailure();
            cache.attend(layer, okv::span<const float>(q.data(), t * qd), a.q_heads,
                         okv::span<float>(o.data(), t * qd), &opts);
            dm_unheads(o.data(), t, a.q_heads, a.head_dim, tmp.data());
            dm_matmul(tmp.data(), t, qd, w.wo[layer], hd, proj.data());
            for (std::size_t i = 0; i < t * hd; i++) x[i] += proj[i];
        }
    }

    // A step that may fail: on failure, rewind to the length before it and retry.
    void step(const std::vector<std::size_t> &tokens, bool fail_first, std::size_t &rewinds) {
        const std::size_t before = cache.length();
        try {
            forward(tokens, fail_first);
        } catch (const SimulatedFailure &) {
            cache.rewind(before);
            rewinds++;
            forward(tokens, false);
        }
    }
};

const char USAGE[] =
    "usage: runner-cpp [--prefix N] [--decode N] [--chunk N] [--layers N] [--window N]\n"
    "                  [--hidden N] [--q-heads N] [--kv-heads N] [--head-dim N] [--vocab N]\n"
    "                  [--seed INT] [--threads N] [--fail-at M] [--dtype NAME] [--restore-at M]\n"
    "One sequence of the offgraph-kv demo model through the C++ wrapper, in the step protocol.\n";

}  // namespace

int main(int argc, char **argv) {
    dm_args a = dm_default_args();
    a.seqs = 1;
    long fail_at = -1, restore_at = -1;
    okv::Dtype dtype = okv::Dtype::f16;
    for (int i = 1; i < argc; i++) {
        std::string f = argv[i];
        if (f == "-h" || f == "--help") {
            std::fputs(USAGE, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "%srunner-cpp: error: %s needs a value\n", USAGE, argv[i]);
            return 2;
        }
        if (f == "--fail-at") {
            fail_at = std::stol(argv[++i]);
            continue;
        }
        if (f == "--restore-at") {
            restore_at = std::stol(argv[++i]);
            continue;
        }
        if (f == "--dtype") {
            try {
                dtype = okv::dtype_from_name(argv[++i]);
            } catch (const okv::Error &e) {
                std::fprintf(stderr, "%srunner-cpp: error: --dtype: %s\n", USAGE, e.what());
                return 2;
            }
            continue;
        }
        if (f == "--seqs" || dm_parse_flag(&a, argv[i], argv[i + 1]) != 1) {
            std::fprintf(stderr, "%srunner-cpp: error: bad or unknown argument %s\n", USAGE, argv[i]);
            return 2;
        }
        i++;
    }
    if (a.q_heads % a.kv_heads != 0 || a.window > a.prefix + a.decode) {
        std::fprintf(stderr, "runner-cpp: error: --q-heads must be a multiple of --kv-heads, --window at most "
                             "--prefix + --decode\n");
        return 2;
    }
    dm_weights w;
    if (dm_make_weights(&a, &w) != 0) {
        std::fprintf(stderr, "runner-cpp: out of memory\n");
        return 1;
    }
    int rc = 1;
    try {
        Runner r(a, w, dtype);
        std::size_t rewinds = 0;
        for (std::size_t start = 0; start < a.prefix; start += a.chunk) {
            std::vector<std::size_t> chunk;
            for (std::size_t p = start; p < std::min(start + a.chunk, a.prefix); p++) chunk.push_back(dm_prompt_token(&a, p));
            r.step(chunk, false, rewinds);
        }
        std::size_t restored = 0;
        std::vector<std::size_t> tok{dm_fork_token(&a, 0)}, generated;
        std::vector<float> scratch(a.hidden + a.vocab);
        for (std::size_t m = 0; m < a.decode; m++) {
            if (!r.cache.can_extend(1)) break;  // full: admission would refuse the step
            if (static_cast<long>(m) == restore_at) {
                // The conversation as bytes (what another process could load),
                // then a new cache restored from them replaces this one.
                const std::vector<std::uint8_t> snap = r.cache.save();
                okv::KvSequenceCache fresh(Runner::config(a, r.dtype));
                fresh.load(snap);
                r.cache = std::move(fresh);
                restored = snap.size();
            }
            r.step(tok, static_cast<long>(m) == fail_at, rewinds);
            dm_next_tokens(&a, &w, r.x.data(), 1, scratch.data(), tok.data());
            generated.push_back(tok[0]);
        }
        std::printf("offgraph-kv runner (C++ wrapper, %s pools): length %zu, %zu rewinds, %zu ring-wrapping layer "
                    "writes, restored from a %zu-byte snapshot: %s\n",
                    okv::dtype_name(r.dtype).c_str(), r.cache.length(), rewinds, r.ring_wraps, restored,
                    restored ? "yes" : "no");
        std::printf("generated: [[");
        for (std::size_t i = 0; i < generated.size(); i++) std::printf(i ? ", %zu" : "%zu", generated[i]);
        std::printf("]]\n");
        rc = 0;
    } catch (const okv::Error &e) {
        std::fprintf(stderr, "runner-cpp: %s\n", e.what());
    }
    dm_free_weights(&w);
    return rc;
}
