// The C++ wrapper: exceptions carry the status and the message, handles are
// owned (move-only), spans take containers, and a refused call through the
// wrapper changes nothing either.
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "offgraph_kv.hpp"
#include "check.h"

template <class F>
static okv_status status_of(F &&f) {
    try {
        f();
        return OKV_OK;
    } catch (const okv::Error &e) {
        return e.status();
    }
}

// Float16 pools written with float16 bits, typed views, and snapshots as
// std::vector<uint8_t> (a cell cache's too).
static void test_dtypes_and_snapshots() {
    okv::Config cfg(16, 1);
    cfg.layer(okv::flat(2, 32)).max_step(2).dtype(okv::Dtype::f16);
    EXPECT(cfg.dtypes().first == okv::Dtype::f16 && cfg.dtypes().second == okv::Dtype::f16);
    EXPECT(okv::dtype_from_name("q8_0") == okv::Dtype::q8_0 && okv::dtype_name(okv::Dtype::bf16) == "bfloat16");
    EXPECT_STATUS(status_of([&] { cfg.dtypes(okv::Dtype::f16, static_cast<okv::Dtype>(17)); }), OKV_ERR_INVALID_CONFIG);
    okv::KvSequenceCache kv(cfg);
    kv.begin_step(2);
    std::vector<std::uint16_t> k(2 * 2 * 32, 0x3c00), v(2 * 2 * 32, 0xbc00);  // 1.0 and -1.0
    kv.update_f16(0, k, v);
    okv::PoolView p = kv.pool(0);
    EXPECT(p.k_type() == okv::Dtype::f16 && p.k_row_bytes == 64);
    okv::span<const std::uint16_t> bits = p.k_rows<std::uint16_t>();
    EXPECT(bits.size() == 2 * p.slots * 32 && bits[0] == 0x3c00 && bits[32] == 0x3c00);
    EXPECT_STATUS(status_of([&] { p.k_rows<float>(); }), OKV_ERR_INVALID_ARGUMENT);
    std::vector<float> vf = p.v_float();
    EXPECT(vf.size() == 2 * p.slots * 32 && vf[0] == -1.0f && vf[33] == -1.0f);
    EXPECT(kv.nbytes() == 2 * 2 * 2 * 64);  // K and V, 2 heads, the 2 rows written
    std::vector<std::uint8_t> snap = kv.save();
    okv::KvSequenceCache back(cfg);
    back.load(snap);
    EXPECT(back.length() == 2 && back.save() == snap);
    EXPECT(kv.save_range(0, 1) != snap);
    std::vector<std::uint8_t> cut(snap.begin(), snap.end() - 1);
    okv::KvSequenceCache other(cfg);
    EXPECT_STATUS(status_of([&] { other.load(cut); }), OKV_ERR_SNAPSHOT);
    EXPECT(other.length() == 0);

    okv::KvCellCache kc(cfg, 8, 2);
    std::uint64_t s = kc.seq_new();
    std::vector<std::uint64_t> ids{s, s};
    std::vector<std::size_t> pos{0, 1};
    kc.begin_step(ids, pos);
    kc.update_bf16(0, k, v);
    std::vector<std::uint8_t> blob = kc.save_seq(s);
    std::uint64_t t = kc.load_seq(blob);
    EXPECT(t != s && kc.seq_len(t) == 2 && kc.save_seq(t) == blob && kc.free_cells() == 4);
    EXPECT_STATUS(status_of([&] { kc.load_seq(snap); }), OKV_ERR_SNAPSHOT);
    EXPECT(kc.free_cells() == 4);
}

int main() {
    static_assert(!std::is_copy_constructible<okv::KvCellCache>::value, "handles are owned, not copied");
    static_assert(std::is_move_constructible<okv::KvCellCache>::value, "handles move");

    okv::Config cfg(16, 2);
    EXPECT_STATUS(status_of([&] { cfg.validate(); }), OKV_ERR_INVALID_CONFIG);
    try {
        okv::SequenceCache bad(cfg);
        EXPECT(false);
    } catch (const okv::Error &e) {
        EXPECT(e.status() == OKV_ERR_INVALID_CONFIG);
        EXPECT(std::string(e.what()).find("OKV_ERR_INVALID_CONFIG: layers") == 0);
    }
    std::vector<okv_layer_config> layers{okv::flat(1, 4), okv::ring(4, 1, 4)};
    cfg.layers(layers).max_step(4);
    EXPECT(cfg.depth(0) == 16 && cfg.depth(1) == 7);
    // flat: 4 + 2 * 3 = 10; ring (keeps 4 + 4 - 1 = 7): min(4, 7) + 2 * min(3, 7) + 2 = 12.
    EXPECT(okv::cells_for_forks(cfg, 4, 2, 3) == 12);
    EXPECT_STATUS(status_of([&] { okv::cells_for_forks(cfg, 4, SIZE_MAX, 3); }), OKV_ERR_INVALID_ARGUMENT);

    okv::KvSequenceCache kv(cfg);
    EXPECT(kv.begin_step(3) == 0);
    std::vector<float> k(12, 1.0f), v(12, 2.0f), q(24, 0.5f), out(24, 0.0f);
    for (std::size_t l = 0; l < 2; l++) kv.update(l, k, v);
    kv.attend(1, q, 2, out);
    EXPECT(out[0] == 2.0f && out[23] == 2.0f);
    std::vector<float> short_k(11, 1.0f);
    EXPECT_STATUS(status_of([&] { kv.update(0, short_k, v); }), OKV_ERR_SHAPE);
    EXPECT_STATUS(status_of([&] { kv.begin_step(5); }), OKV_ERR_INVALID_ARGUMENT);
    EXPECT(kv.length() == 3 && kv.plan(0).n_tokens == 3);
    okv::KvSequenceCache moved(std::move(kv));
    EXPECT(moved.length() == 3);
    moved.rewind(1);
    EXPECT(moved.length() == 1);
    EXPECT_STATUS(status_of([&] { moved.plan(0); }), OKV_ERR_STEP_PROTOCOL);

    okv::KvCellCache cc(cfg, 32, 8);
    std::uint64_t a = cc.seq_new();
    std::vector<std::uint64_t> ids(3, a);
    std::vector<std::size_t> pos{0, 1, 2};
    cc.begin_step(ids, pos);
    for (std::size_t l = 0; l < 2; l++) cc.update(l, k, v);
    std::uint64_t b = cc.seq_clone(a, 2);
    EXPECT(cc.seq_len(b) == 2 && cc.next_pos(b) == 2);
    std::vector<std::uint64_t> step_ids{a, b};
    std::vector<std::size_t> step_pos{3, 2};
    cc.begin_step(step_ids, step_pos);
    EXPECT(cc.visible(0, 0).size() == 1 && cc.visible(0, 0)[0].len == 4);
    auto m = cc.dense_mask(0);
    EXPECT(m.rows == 2 && m.cols == 5);
    std::vector<std::size_t> one{9};
    EXPECT_STATUS(status_of([&] { cc.begin_step(step_ids, one); }), OKV_ERR_SHAPE);
    EXPECT_STATUS(status_of([&] { cc.seq_free(12345); }), OKV_ERR_UNKNOWN_SEQUENCE);
    EXPECT(cc.plan(0).n_tokens == 2);

    std::string key = okv::registry::unique_key("cpp-test-a-rather-long-prefix-to-grow-the-buffer-");
    EXPECT(key.rfind("cpp-test-a-rather-long-prefix-to-grow-the-buffer-", 0) == 0);
    okv::registry::install(key, cc);
    EXPECT_STATUS(status_of([&] { okv::registry::install(key, moved); }), OKV_ERR_KEY_EXISTS);
    auto got = okv::registry::get(key);
    EXPECT(got.first == OKV_HANDLE_KV_CELL_CACHE && got.second == static_cast<void *>(cc.get()));
    okv::registry::erase(key);
    EXPECT(!okv::registry::contains(key));
    std::string session_key;
    {
        okv::Session session(cc);
        session_key = session.key();
        EXPECT(session_key.rfind("session-", 0) == 0 && okv::registry::contains(session_key));
        EXPECT_STATUS(status_of([&] { okv::Session again(cc, session_key); }), OKV_ERR_KEY_EXISTS);
        EXPECT(okv::registry::contains(session_key)); /* the refused session erased nothing */
    }
    EXPECT(!okv::registry::contains(session_key));
    okv::registry::register_builder(
        "cpp-test", "cells",
        [](const okv_config *c, void *, void **out) -> int32_t {
            okv_kv_cell_cache *h = nullptr;
            okv_status s = okv_kv_cell_cache_new(c, 64, 4, &h);
            *out = h;
            return static_cast<int32_t>(s);
        },
        nullptr);
    EXPECT(okv::registry::has_builder("cpp-test", "cells") && !okv::registry::has_builder("cpp-test", "other"));
    auto built = okv::registry::build("cpp-test", "cells", cfg);
    EXPECT(built.first == OKV_HANDLE_KV_CELL_CACHE);
    EXPECT_OK(okv_kv_cell_cache_free(static_cast<okv_kv_cell_cache *>(built.second)));
    EXPECT_STATUS(status_of([&] { okv::registry::build("cpp-test", "other", cfg); }), OKV_ERR_NOT_FOUND);
    test_dtypes_and_snapshots();
    return CHECK_SUMMARY("wrapper");
}
