//! What the two pool-owning caches (`okv_kv_seq_cache`, `okv_kv_cell_cache`)
//! share: their pool views, `_update` (float32, float16 and bfloat16 rows),
//! `_attend` and `_nbytes`, written once over [`PoolFace`].

use offgraph_kv::kv::Pool;
use offgraph_kv::{AttendSpec, KvCellCache, KvSequenceCache, RowsIn};

use crate::attend::{self, AttendArgs};
use crate::handle::{lock, query, Opaque};
use crate::ptr::{overlaps, slice, span, span_of};
use crate::status::{fail, okv_status, R};

/// One layer's K and V pools: `[n_kv_heads, slots]` rows of `k_row_bytes`
/// (`v_row_bytes`) bytes each, row-major, stored in `k_dtype` (`v_dtype`):
/// head h's row s starts at byte `(h * slots + s) * row_bytes`. A float32
/// row is `head_dim` floats, a float16/bfloat16 row `head_dim` `uint16_t`
/// bits, a q8_0 row `head_dim / 32` GGML blocks (`okv_dequantize` widens any
/// of them). Pools reserve their depth (`slots`) once, so the pointers stay
/// valid until `_free` and read the rows later steps write (zeros after
/// `_clear` or a `_trim` of their cells). Where the OS refused the
/// reservation the pools grow by copying: then a view is valid only until
/// the next mutating call (`_update` may move them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct okv_pool_view {
    /// The K rows (64-byte aligned).
    pub k: *const std::ffi::c_void,
    /// The V rows (64-byte aligned).
    pub v: *const std::ffi::c_void,
    pub n_kv_heads: usize,
    /// The row stride, in rows.
    pub slots: usize,
    pub head_dim: usize,
    /// The `OKV_DTYPE_*` of the K rows.
    pub k_dtype: u32,
    /// The `OKV_DTYPE_*` of the V rows.
    pub v_dtype: u32,
    /// Bytes one K row takes.
    pub k_row_bytes: usize,
    /// Bytes one V row takes.
    pub v_row_bytes: usize,
}

fn pool_to_c(p: &Pool) -> okv_pool_view {
    use offgraph_kv::kv::Side;
    okv_pool_view {
        k: p.k().bytes.as_ptr().cast(),
        v: p.v().bytes.as_ptr().cast(),
        n_kv_heads: p.n_heads(),
        slots: p.slots(),
        head_dim: p.head_dim(),
        k_dtype: crate::dtype::dtype_to_c(p.k_dtype()),
        v_dtype: crate::dtype::dtype_to_c(p.v_dtype()),
        k_row_bytes: p.row_bytes(Side::K),
        v_row_bytes: p.row_bytes(Side::V),
    }
}

/// Refuses K/V rows that overlap the layer's pools (they would be read while written).
fn check_rows_apart(pool: &Pool, k: (usize, usize), v: (usize, usize), what: &str) -> R<()> {
    for input in [k, v] {
        if overlaps(input, span_of(pool.k().bytes)) || overlaps(input, span_of(pool.v().bytes)) {
            return Err(fail(
                okv_status::OKV_ERR_INVALID_ARGUMENT,
                format!("{what}: k or v overlaps the cache's own pools; copy the rows first"),
            ));
        }
    }
    Ok(())
}

/// The byte faces both pool-owning caches have.
pub(crate) trait PoolFace {
    fn pool(&self, layer: usize) -> offgraph_kv::Result<&Pool>;
    fn update(&mut self, layer: usize, k: RowsIn<'_>, v: RowsIn<'_>) -> offgraph_kv::Result<()>;
    fn spec(&self, layer: usize) -> offgraph_kv::Result<AttendSpec<'_>>;
    fn nbytes_total(&self) -> usize;
}

/// Implements [`PoolFace`] by forwarding to the cache's own methods.
macro_rules! pool_face {
    ($cache:ty) => {
        impl PoolFace for $cache {
            fn pool(&self, layer: usize) -> offgraph_kv::Result<&Pool> {
                <$cache>::pool(self, layer)
            }
            fn update(
                &mut self,
                layer: usize,
                k: RowsIn<'_>,
                v: RowsIn<'_>,
            ) -> offgraph_kv::Result<()> {
                <$cache>::update_rows(self, layer, k, v).map(|_| ())
            }
            fn spec(&self, layer: usize) -> offgraph_kv::Result<AttendSpec<'_>> {
                <$cache>::spec(self, layer)
            }
            fn nbytes_total(&self) -> usize {
                <$cache>::nbytes_total(self)
            }
        }
    };
}
pool_face!(KvSequenceCache);
pool_face!(KvCellCache);

/// IEEE half bits (`_update_f16`).
pub(crate) struct F16Bits;
/// bfloat16 bits (`_update_bf16`).
pub(crate) struct Bf16Bits;
/// `_update` rows of u16 bits, read as half (`F16Bits`) or bfloat16 (`Bf16Bits`).
pub(crate) trait BitsKind {
    fn rows(s: &[u16]) -> RowsIn<'_>;
}
impl BitsKind for F16Bits {
    fn rows(s: &[u16]) -> RowsIn<'_> {
        RowsIn::F16(s)
    }
}
impl BitsKind for Bf16Bits {
    fn rows(s: &[u16]) -> RowsIn<'_> {
        RowsIn::Bf16(s)
    }
}

/// `_update`: the open step's rows of `layer` (float32), refused whole when
/// they overlap the pools or have the wrong length.
pub(crate) unsafe fn update<H: Opaque>(
    h: *const H,
    layer: usize,
    (k, k_len): (*const f32, usize),
    (v, v_len): (*const f32, usize),
    what: &str,
) -> R<()>
where
    H::Inner: PoolFace,
{
    unsafe { update_with(h, layer, (k, k_len), (v, v_len), what, |s| RowsIn::F32(s)) }
}

/// `_update_f16` / `_update_bf16`: the same with rows as `uint16_t` bits.
pub(crate) unsafe fn update_bits<H: Opaque, B: BitsKind>(
    h: *const H,
    layer: usize,
    (k, k_len): (*const u16, usize),
    (v, v_len): (*const u16, usize),
    what: &str,
) -> R<()>
where
    H::Inner: PoolFace,
{
    unsafe { update_with(h, layer, (k, k_len), (v, v_len), what, B::rows) }
}

unsafe fn update_with<H: Opaque, T>(
    h: *const H,
    layer: usize,
    (k, k_len): (*const T, usize),
    (v, v_len): (*const T, usize),
    what: &str,
    rows: fn(&[T]) -> RowsIn<'_>,
) -> R<()>
where
    H::Inner: PoolFace,
{
    let mut c = unsafe { lock(h, what) }?;
    if let Ok(pool) = c.pool(layer) {
        check_rows_apart(pool, span(k, k_len), span(v, v_len), what)?;
    }
    let k = unsafe { slice(k, k_len, "k") }.map_err(|f| f.within(what))?;
    let v = unsafe { slice(v, v_len, "v") }.map_err(|f| f.within(what))?;
    c.update(layer, rows(k), rows(v))?;
    Ok(())
}

/// `_attend`: attention of the open step at `layer` into the caller's buffer.
pub(crate) unsafe fn attend<H: Opaque>(
    h: *const H,
    layer: usize,
    args: &AttendArgs,
    what: &str,
) -> R<()>
where
    H::Inner: PoolFace,
{
    let c = unsafe { lock(h, what) }?;
    let spec = c.spec(layer)?;
    unsafe { attend::run(&spec, args, what) }
}

/// `_pool`: layer `layer`'s pools.
pub(crate) unsafe fn pool<H: Opaque>(
    h: *const H,
    layer: usize,
    o: *mut okv_pool_view,
    what: &str,
) -> R<()>
where
    H::Inner: PoolFace,
{
    unsafe { query(h, o, what, |c| Ok(pool_to_c(c.pool(layer)?))) }
}

/// `_nbytes`: bytes all pools hold.
pub(crate) unsafe fn nbytes<H: Opaque>(h: *const H, o: *mut usize, what: &str) -> R<()>
where
    H::Inner: PoolFace,
{
    unsafe { query(h, o, what, |c| Ok(c.nbytes_total())) }
}
