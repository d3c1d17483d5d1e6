// offgraph-kv for C++17: a header-only wrapper over offgraph_kv.h.
//
// - RAII: every handle is owned by a move-only object that frees it.
// - Errors: a failed call throws okv::Error carrying the okv_status and the
//   library's message (okv_last_error() of the failing thread).
// - Buffers: okv::span<T> (pointer + size) is built from a pointer and a
//   length or from any contiguous container with data() and size().
// - Dtypes: Config::dtypes picks the pools' storage; update() takes float32
//   rows, update_f16()/update_bf16() rows as uint16_t bits; a PoolView says
//   its dtype and gives its rows typed (rows<T>) or as float32 (dequantize).
// - Snapshots: save()/save_seq() return std::vector<uint8_t>, load()/load_seq()
//   take any byte span; the bytes are those Python and Rust write.
// - Lifetimes and threads are the C API's: plans' pointers, dense masks and
//   pool views stay valid until the next mutating call on that cache; one
//   object must not be used by two threads at once (okv::Error with
//   OKV_ERR_BUSY says it was).
#ifndef OFFGRAPH_KV_HPP
#define OFFGRAPH_KV_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "offgraph_kv.h"

namespace okv {

// A failed call: the status and the library's message.
class Error : public std::runtime_error {
public:
    Error(okv_status status, const std::string &message)
        : std::runtime_error(std::string(okv_status_name(static_cast<int32_t>(status))) + ": " + message),
          status_(status) {}
    okv_status status() const noexcept { return status_; }

private:
    okv_status status_;
};

// Throws okv::Error unless `s` is OKV_OK.
inline void check(okv_status s) {
    if (s != OKV_OK) throw Error(s, okv_last_error());
}

// A non-owning view of `size()` contiguous elements.
template <class T>
class span {
public:
    span() noexcept = default;
    span(T *data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <class C, class = std::enable_if_t<std::is_convertible<decltype(std::declval<C &>().data()), T *>::value>>
    span(C &c) noexcept : data_(c.data()), size_(c.size()) {}  // NOLINT: implicit by design
    T *data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    T *begin() const noexcept { return data_; }
    T *end() const noexcept { return data_ + size_; }
    T &operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    T *data_ = nullptr;
    std::size_t size_ = 0;
};

inline okv_layer_config flat(std::size_t n_kv_heads, std::size_t head_dim) {
    return okv_layer_config{OKV_POLICY_FLAT, 0, n_kv_heads, head_dim};
}
inline okv_layer_config ring(std::size_t window, std::size_t n_kv_heads, std::size_t head_dim) {
    return okv_layer_config{OKV_POLICY_RING, window, n_kv_heads, head_dim};
}

// A pool dtype (the OKV_DTYPE_* values).
enum class Dtype : std::uint32_t {
    f32 = OKV_DTYPE_F32,
    f16 = OKV_DTYPE_F16,
    bf16 = OKV_DTYPE_BF16,
    q8_0 = OKV_DTYPE_Q8_0,
};

namespace detail {
template <class H, okv_status (*Free)(H *)>
struct Deleter {
    void operator()(H *h) const noexcept { (void)Free(h); }
};
template <class H, okv_status (*Free)(H *)>
using Owned = std::unique_ptr<H, Deleter<H, Free>>;
}  // namespace detail

// A cache configuration (copied by every cache built from it).
class Config {
public:
    Config(std::size_t capacity, std::size_t n_layers) {
        okv_config *c = nullptr;
        check(okv_config_new(capacity, n_layers, &c));
        h_.reset(c);
    }
    // One layer config for every layer, or one per layer.
    Config &layers(span<const okv_layer_config> ls) {
        check(okv_config_set_layers(h_.get(), ls.data(), ls.size()));
        return *this;
    }
    Config &layer(const okv_layer_config &l) { return layers(span<const okv_layer_config>(&l, 1)); }
    Config &max_step(std::size_t n) {
        check(okv_config_set_max_step(h_.get(), n));
        return *this;
    }
    Config &initial_capacity(std::size_t n) {
        check(okv_config_set_initial_capacity(h_.get(), n));
        return *this;
    }
    // The storage of every K pool and every V pool (float32 by default).
    Config &dtypes(Dtype k, Dtype v) {
        check(okv_config_set_dtypes(h_.get(), static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(v)));
        return *this;
    }
    Config &dtype(Dtype kv) { return dtypes(kv, kv); }
    std::pair<Dtype, Dtype> dtypes() const {
        std::uint32_t k = 0, v = 0;
        check(okv_config_dtypes(h_.get(), &k, &v));
        return {static_cast<Dtype>(k), static_cast<Dtype>(v)};
    }
    void validate() const { check(okv_config_validate(h_.get())); }
    std::size_t depth(std::size_t layer) const {
        std::size_t d = 0;
        check(okv_config_depth(h_.get(), layer, &d));
        return d;
    }
    const okv_config *get() const noexcept { return h_.get(); }

private:
    detail::Owned<okv_config, okv_config_free> h_;
};

// Cells a CellCache / KvCellCache of `cfg` needs for `n_seqs` sequences forked
// from one `prefix`-token sequence, each then growing by `new_tokens` positions.
inline std::size_t cells_for_forks(const Config &cfg, std::size_t prefix, std::size_t n_seqs,
                                   std::size_t new_tokens) {
    std::size_t n = 0;
    check(okv_cells_for_forks(cfg.get(), prefix, n_seqs, new_tokens, &n));
    return n;
}

// A dtype by its Python name ("float32", "float16", "bfloat16", "q8_0").
inline Dtype dtype_from_name(const std::string &name) {
    std::uint32_t d = 0;
    check(okv_dtype_from_name(name.c_str(), &d));
    return static_cast<Dtype>(d);
}
inline std::string dtype_name(Dtype d) { return okv_dtype_name(static_cast<std::uint32_t>(d)); }

// Stored rows of `dtype` (`src`, whole rows) as float32 values into `dst`.
inline void dequantize(Dtype dtype, span<const std::uint8_t> src, span<float> dst) {
    check(okv_dequantize(static_cast<std::uint32_t>(dtype), src.data(), src.size(), dst.data(), dst.size()));
}

// The element type of a dtype's rows: float (float32), std::uint16_t bits
// (float16, bfloat16), std::uint8_t bytes (q8_0 blocks).
template <class T>
inline bool holds(Dtype d) noexcept {
    if (std::is_same<T, float>::value) return d == Dtype::f32;
    if (std::is_same<T, std::uint16_t>::value) return d == Dtype::f16 || d == Dtype::bf16;
    return std::is_same<T, std::uint8_t>::value;
}

// One layer's pools (an okv_pool_view) with typed access; valid until the
// next mutating call on the cache.
struct PoolView : okv_pool_view {
    Dtype k_type() const noexcept { return static_cast<Dtype>(k_dtype); }
    Dtype v_type() const noexcept { return static_cast<Dtype>(v_dtype); }
    std::size_t k_bytes() const noexcept { return n_kv_heads * slots * k_row_bytes; }
    std::size_t v_bytes() const noexcept { return n_kv_heads * slots * v_row_bytes; }
    // The K (V) rows as T; okv::Error (OKV_ERR_INVALID_ARGUMENT) when T does
    // not hold the pool's dtype (see okv::holds).
    template <class T>
    span<const T> k_rows() const {
        return typed<T>(k, k_type(), k_bytes());
    }
    template <class T>
    span<const T> v_rows() const {
        return typed<T>(v, v_type(), v_bytes());
    }
    // The rows as float32 [n_kv_heads, slots, head_dim] (a copy).
    std::vector<float> k_float() const { return widen(k, k_type(), k_bytes()); }
    std::vector<float> v_float() const { return widen(v, v_type(), v_bytes()); }

private:
    template <class T>
    static span<const T> typed(const void *p, Dtype d, std::size_t bytes) {
        if (!holds<T>(d)) throw Error(OKV_ERR_INVALID_ARGUMENT, "PoolView: rows of " + dtype_name(d) + " asked as another type");
        return span<const T>(static_cast<const T *>(p), bytes / sizeof(T));
    }
    std::vector<float> widen(const void *p, Dtype d, std::size_t bytes) const {
        std::vector<float> out(n_kv_heads * slots * head_dim);
        dequantize(d, span<const std::uint8_t>(static_cast<const std::uint8_t *>(p), bytes), out);
        return out;
    }
};

namespace detail {
// Calls `f(buf, cap, &len)` of the size-query convention: a first call with no
// buffer for the size, then one into a vector of that size.
template <class Fn>
std::vector<std::uint8_t> fetch_bytes(Fn f) {
    std::size_t n = 0;
    okv_status s = f(nullptr, 0, &n);
    std::vector<std::uint8_t> buf;
    if (s == OKV_ERR_BUFFER_TOO_SMALL) {
        buf.resize(n);
        s = f(buf.data(), buf.size(), &n);
    }
    check(s);
    buf.resize(n);
    return buf;
}

// The C functions of one cache kind, named by its prefix (okv_seq_cache, ...):
// the four kinds share their verbs' names, so each table is written once.
#define OKV_DETAIL_FN(P, verb) static constexpr auto verb = &P##_##verb;
#define OKV_DETAIL_COMMON_FNS(P)                 \
    using handle = P;                            \
    static constexpr auto make = &P##_new;       \
    OKV_DETAIL_FN(P, free)                       \
    OKV_DETAIL_FN(P, capacity)                   \
    OKV_DETAIL_FN(P, can_extend)                 \
    OKV_DETAIL_FN(P, clear)                      \
    OKV_DETAIL_FN(P, begin_step)                 \
    OKV_DETAIL_FN(P, plan)
#define OKV_DETAIL_SEQ_FNS(P)                    \
    OKV_DETAIL_COMMON_FNS(P)                     \
    OKV_DETAIL_FN(P, length)                     \
    OKV_DETAIL_FN(P, min_rewind)                 \
    OKV_DETAIL_FN(P, rewind)
#define OKV_DETAIL_CELL_FNS(P)                   \
    OKV_DETAIL_COMMON_FNS(P)                     \
    OKV_DETAIL_FN(P, seq_new)                    \
    OKV_DETAIL_FN(P, seq_clone)                  \
    OKV_DETAIL_FN(P, seq_rm)                     \
    OKV_DETAIL_FN(P, seq_free)                   \
    OKV_DETAIL_FN(P, next_pos)                   \
    OKV_DETAIL_FN(P, seq_len)                    \
    OKV_DETAIL_FN(P, free_cells)                 \
    OKV_DETAIL_FN(P, visible)                    \
    OKV_DETAIL_FN(P, dense_mask)
#define OKV_DETAIL_POOL_FNS(P)                   \
    OKV_DETAIL_FN(P, update)                     \
    OKV_DETAIL_FN(P, update_f16)                 \
    OKV_DETAIL_FN(P, update_bf16)                \
    OKV_DETAIL_FN(P, attend)                     \
    OKV_DETAIL_FN(P, pool)                       \
    OKV_DETAIL_FN(P, nbytes)
struct SeqFns {
    OKV_DETAIL_SEQ_FNS(okv_seq_cache)
};
struct KvSeqFns {
    OKV_DETAIL_SEQ_FNS(okv_kv_seq_cache)
    OKV_DETAIL_POOL_FNS(okv_kv_seq_cache)
};
struct CellFns {
    OKV_DETAIL_CELL_FNS(okv_cell_cache)
};
struct KvCellFns {
    OKV_DETAIL_CELL_FNS(okv_kv_cell_cache)
    OKV_DETAIL_POOL_FNS(okv_kv_cell_cache)
};
#undef OKV_DETAIL_POOL_FNS
#undef OKV_DETAIL_CELL_FNS
#undef OKV_DETAIL_SEQ_FNS
#undef OKV_DETAIL_COMMON_FNS
#undef OKV_DETAIL_FN

// The owned handle and the verbs every cache kind has.
template <class F>
class BasicCache {
public:
    using handle_type = typename F::handle;
    using fns = F;
    std::size_t capacity() const { return get_size(F::capacity); }
    bool can_extend(std::size_t n = 1) const {
        bool ok = false;
        check(F::can_extend(h_.get(), n, &ok));
        return ok;
    }
    void clear() { check(F::clear(h_.get())); }
    handle_type *get() const noexcept { return h_.get(); }

protected:
    // Takes a handle `make` has just published (throws, owning nothing, on failure).
    template <class... Args>
    explicit BasicCache(const Config &cfg, Args... args) {
        handle_type *h = nullptr;
        check(F::make(cfg.get(), args..., &h));
        h_.reset(h);
    }
    std::size_t get_size(okv_status (*fn)(const handle_type *, std::size_t *)) const {
        std::size_t n = 0;
        check(fn(h_.get(), &n));
        return n;
    }
    Owned<handle_type, F::free> h_;
};

// The control and planner faces both sequence caches share.
template <class F>
class BasicSequenceCache : public BasicCache<F> {
public:
    explicit BasicSequenceCache(const Config &cfg) : BasicCache<F>(cfg) {}
    std::size_t length() const { return this->get_size(F::length); }
    std::size_t min_rewind() const { return this->get_size(F::min_rewind); }
    // Admission: commits the step and returns its first position.
    std::size_t begin_step(std::size_t n_tokens) {
        std::size_t pos = 0;
        check(F::begin_step(this->h_.get(), n_tokens, &pos));
        return pos;
    }
    void rewind(std::size_t new_len) { check(F::rewind(this->h_.get(), new_len)); }
    okv_seq_plan plan(std::size_t layer) const {
        okv_seq_plan p{};
        check(F::plan(this->h_.get(), layer, &p));
        return p;
    }
};

// The batch, step and planner faces both cell caches share.
template <class F>
class BasicCellCache : public BasicCache<F> {
public:
    BasicCellCache(const Config &cfg, std::size_t n_cells, std::size_t n_seq_max = 256)
        : BasicCache<F>(cfg, n_cells, n_seq_max) {}
    std::uint64_t seq_new() {
        std::uint64_t id = 0;
        check(F::seq_new(this->h_.get(), &id));
        return id;
    }
    // A fork owning src's cells below `upto` (OKV_NONE: all); no K/V copied.
    std::uint64_t seq_clone(std::uint64_t src, std::size_t upto = OKV_NONE) {
        std::uint64_t id = 0;
        check(F::seq_clone(this->h_.get(), src, upto, &id));
        return id;
    }
    void seq_rm(std::uint64_t seq, std::size_t p0 = 0, std::size_t p1 = OKV_NONE) {
        check(F::seq_rm(this->h_.get(), seq, p0, p1));
    }
    void seq_free(std::uint64_t seq) { check(F::seq_free(this->h_.get(), seq)); }
    std::size_t next_pos(std::uint64_t seq) const { return per_seq(F::next_pos, seq); }
    std::size_t seq_len(std::uint64_t seq) const { return per_seq(F::seq_len, seq); }
    std::size_t free_cells() const { return this->get_size(F::free_cells); }
    // One entry per token; all or nothing.
    void begin_step(span<const std::uint64_t> seq_ids, span<const std::size_t> positions) {
        if (seq_ids.size() != positions.size())
            throw Error(OKV_ERR_SHAPE, "begin_step: seq_ids and positions differ in length");
        check(F::begin_step(this->h_.get(), seq_ids.data(), positions.data(), seq_ids.size()));
    }
    okv_cell_plan plan(std::size_t layer) const {
        okv_cell_plan p{};
        check(F::plan(this->h_.get(), layer, &p));
        return p;
    }
    std::vector<okv_run> visible(std::size_t layer, std::size_t token) const {
        std::vector<okv_run> runs(4);
        std::size_t n = 0;
        okv_status s = F::visible(this->h_.get(), layer, token, runs.data(), runs.size(), &n);
        if (s == OKV_ERR_BUFFER_TOO_SMALL) {
            runs.resize(n);
            s = F::visible(this->h_.get(), layer, token, runs.data(), runs.size(), &n);
        }
        check(s);
        runs.resize(n);
        return runs;
    }
    struct Mask {
        const std::uint8_t *data;
        std::size_t rows, cols;
    };
    // [tokens, read_len] bytes, 1 = visible; valid until the next mutating call.
    Mask dense_mask(std::size_t layer) {
        Mask m{nullptr, 0, 0};
        check(F::dense_mask(this->h_.get(), layer, &m.data, &m.rows, &m.cols));
        return m;
    }

private:
    std::size_t per_seq(okv_status (*fn)(const typename F::handle *, std::uint64_t, std::size_t *),
                        std::uint64_t s) const {
        std::size_t n = 0;
        check(fn(this->h_.get(), s, &n));
        return n;
    }
};

// The byte faces both K/V caches add to their bookkeeping.
template <class Base>
class WithPools : public Base {
    using F = typename Base::fns;

public:
    using Base::Base;
    // Writes the open step's rows of `layer` ([n_kv_heads, n_tokens, head_dim] each).
    void update(std::size_t layer, span<const float> k, span<const float> v) {
        check(F::update(this->h_.get(), layer, k.data(), k.size(), v.data(), v.size()));
    }
    // The same with rows as IEEE half bits, or as bfloat16 bits.
    void update_f16(std::size_t layer, span<const std::uint16_t> k, span<const std::uint16_t> v) {
        check(F::update_f16(this->h_.get(), layer, k.data(), k.size(), v.data(), v.size()));
    }
    void update_bf16(std::size_t layer, span<const std::uint16_t> k, span<const std::uint16_t> v) {
        check(F::update_bf16(this->h_.get(), layer, k.data(), k.size(), v.data(), v.size()));
    }
    // Attention of the open step at `layer` into `out` (same shape as q).
    void attend(std::size_t layer, span<const float> q, std::size_t n_q_heads, span<float> out,
                const okv_attend_options *options = nullptr) const {
        check(F::attend(this->h_.get(), layer, q.data(), q.size(), n_q_heads, out.data(), out.size(), options));
    }
    // Layer `layer`'s pools; valid until the next mutating call.
    PoolView pool(std::size_t layer) const {
        PoolView p{};
        check(F::pool(this->h_.get(), layer, &p));
        return p;
    }
    std::size_t nbytes() const { return this->get_size(F::nbytes); }
};
}  // namespace detail

// One sequence's bookkeeping (no bytes).
class SequenceCache : public detail::BasicSequenceCache<detail::SeqFns> {
public:
    using BasicSequenceCache::BasicSequenceCache;
};

// One sequence's bookkeeping and K/V pools.
class KvSequenceCache : public detail::WithPools<detail::BasicSequenceCache<detail::KvSeqFns>> {
public:
    using WithPools::WithPools;
    // A snapshot of positions [0, upto) (OKV_NONE: the length) that load()
    // restores into an empty cache of the same layout and dtypes.
    std::vector<std::uint8_t> save(std::size_t upto = OKV_NONE) const { return save_range(OKV_NONE, upto); }
    // A range [start, upto) that continues a cache of length `start` (a prefix chunk).
    std::vector<std::uint8_t> save_range(std::size_t start, std::size_t upto = OKV_NONE) const {
        return detail::fetch_bytes([&](std::uint8_t *buf, std::size_t cap, std::size_t *n) {
            return okv_kv_seq_cache_save_state(h_.get(), start, upto, buf, cap, n);
        });
    }
    // Restores a snapshot, all or nothing (okv::Error OKV_ERR_SNAPSHOT).
    void load(span<const std::uint8_t> data) { check(okv_kv_seq_cache_load_state(h_.get(), data.data(), data.size())); }
};

// Many sequences' bookkeeping (no bytes).
class CellCache : public detail::BasicCellCache<detail::CellFns> {
public:
    using BasicCellCache::BasicCellCache;
};

// Many sequences' bookkeeping and K/V pools.
class KvCellCache : public detail::WithPools<detail::BasicCellCache<detail::KvCellFns>> {
public:
    using WithPools::WithPools;
    // A snapshot of `seq`'s positions below `upto` (OKV_NONE: all).
    std::vector<std::uint8_t> save_seq(std::uint64_t seq, std::size_t upto = OKV_NONE) const {
        return detail::fetch_bytes([&](std::uint8_t *buf, std::size_t cap, std::size_t *n) {
            return okv_kv_cell_cache_save_seq(h_.get(), seq, upto, buf, cap, n);
        });
    }
    // Restores a save_seq snapshot as a new sequence; returns its id.
    std::uint64_t load_seq(span<const std::uint8_t> data) {
        std::uint64_t id = 0;
        check(okv_kv_cell_cache_load_seq(h_.get(), data.data(), data.size(), &id));
        return id;
    }
};

// The process-global registry of live handles (it borrows, never owns).
namespace registry {
template <class Cache>
void install(const std::string &key, const Cache &cache) {
    check(okv_registry_install(key.c_str(), cache.get()));
}
inline std::pair<okv_handle_kind, void *> get(const std::string &key) {
    okv_handle_kind kind{};
    void *h = nullptr;
    check(okv_registry_get(key.c_str(), &kind, &h));
    return {kind, h};
}
inline void erase(const std::string &key) { check(okv_registry_erase(key.c_str())); }
inline bool contains(const std::string &key) {
    bool found = false;
    check(okv_registry_contains(key.c_str(), &found));
    return found;
}
// `build` must not throw: it is called from C (return nonzero to fail).
inline void register_builder(const std::string &backend_id, const std::string &kind, okv_builder_fn build,
                             void *user_data) {
    check(okv_registry_register_builder(backend_id.c_str(), kind.c_str(), build, user_data));
}
inline bool has_builder(const std::string &backend_id, const std::string &kind) {
    bool found = false;
    check(okv_registry_has_builder(backend_id.c_str(), kind.c_str(), &found));
    return found;
}
// A new handle (yours to free with the _free of its kind) and its kind.
inline std::pair<okv_handle_kind, void *> build(const std::string &backend_id, const std::string &kind,
                                                const Config &cfg) {
    okv_handle_kind k{};
    void *h = nullptr;
    check(okv_registry_build(backend_id.c_str(), kind.c_str(), cfg.get(), &k, &h));
    return {k, h};
}
inline std::string unique_key(const std::string &prefix) {
    std::string buf(prefix.size() + 24, '\0');
    std::size_t n = 0;
    okv_status s = okv_registry_unique_key(prefix.c_str(), &buf[0], buf.size(), &n);
    if (s == OKV_ERR_BUFFER_TOO_SMALL) {
        buf.assign(n + 1, '\0');
        s = okv_registry_unique_key(prefix.c_str(), &buf[0], buf.size(), &n);
    }
    check(s);
    buf.resize(n);
    return buf;
}
}  // namespace registry

// Installs a cache in the registry for its lifetime: under `key`, or under a
// fresh unique_key("session-") when `key` is empty; erases it when destroyed
// (a key already erased by hand is fine). The cache must outlive the session.
class Session {
public:
    template <class Cache>
    explicit Session(const Cache &cache, std::string key = std::string())
        : key_(key.empty() ? registry::unique_key("session-") : std::move(key)) {
        registry::install(key_, cache);
    }
    ~Session() { (void)okv_registry_erase(key_.c_str()); }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
    const std::string &key() const noexcept { return key_; }

private:
    std::string key_;
};

}  // namespace okv

#endif  // OFFGRAPH_KV_HPP
