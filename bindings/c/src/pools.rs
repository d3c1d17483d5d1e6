//! What the two pool-owning caches (`okv_kv_seq_cache`, `okv_kv_cell_cache`)
//! share: their pool views, `_update`, `_attend` and `_nbytes`, written once
//! over [`PoolFace`].

use offgraph_kv::kv::Pool;
use offgraph_kv::{AttendSpec, KvCellCache, KvSequenceCache};

use crate::attend::{self, AttendArgs};
use crate::handle::{lock, query, Opaque};
use crate::ptr::{overlaps, slice, span, span_of};
use crate::status::{fail, okv_status, R};

/// One layer's K and V pools, `[n_kv_heads, slots, head_dim]` float32
/// row-major. Pools reserve their depth (`slots`) once, so the pointers stay
/// valid until `_free` and read the rows later steps write (zeros after
/// `_clear` or a `_trim` of their cells). Where the OS refused the
/// reservation the pools grow by copying: then a view is valid only until
/// the next mutating call (`_update` may move them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct okv_pool_view {
    pub k: *const f32,
    pub v: *const f32,
    pub n_kv_heads: usize,
    /// The row stride, in rows.
    pub slots: usize,
    pub head_dim: usize,
}

fn pool_to_c(p: &Pool) -> okv_pool_view {
    okv_pool_view {
        // Configs built through C are float32 (pool dtypes are not exposed to
        // C yet), so the rows are f32 and 64-byte aligned.
        k: p.k().bytes.as_ptr().cast::<f32>(),
        v: p.v().bytes.as_ptr().cast::<f32>(),
        n_kv_heads: p.n_heads(),
        slots: p.slots(),
        head_dim: p.head_dim(),
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
    fn update(&mut self, layer: usize, k: &[f32], v: &[f32]) -> offgraph_kv::Result<()>;
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
            fn update(&mut self, layer: usize, k: &[f32], v: &[f32]) -> offgraph_kv::Result<()> {
                <$cache>::update(self, layer, k, v).map(|_| ())
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

/// `_update`: the open step's rows of `layer`, refused whole when they
/// overlap the pools or have the wrong length.
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
    let mut c = unsafe { lock(h, what) }?;
    if let Ok(pool) = c.pool(layer) {
        check_rows_apart(pool, span(k, k_len), span(v, v_len), what)?;
    }
    let k = unsafe { slice(k, k_len, "k") }.map_err(|f| f.within(what))?;
    let v = unsafe { slice(v, v_len, "v") }.map_err(|f| f.within(what))?;
    c.update(layer, k, v)?;
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
