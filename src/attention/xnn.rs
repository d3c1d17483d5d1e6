//! The XNNPACK backend: fully-connected operators over the pools, per block of
//! query rows (one KV head) and chunk of ≤ `CHUNK` keys:
//!
//! 1. `Sᵀ = K_chunk · Qsᵀ`: a fully-connected operator whose *weights* are the
//!    block's scaled query rows (`[out = rows, in = head_dim]`, packed once per
//!    block — small) and whose *input* is the K rows read in place from the pool
//!    (batch = keys). K is therefore never repacked or copied.
//! 2. Mask and online softmax over the columns of `Sᵀ`, natively (the 2022
//!    softmax operator has no mask and no running-max merge across chunks),
//!    vectorised in `colsoftmax.rs`; a soft-cap, when asked, is applied to
//!    the whole tile first (`softcap.rs`).
//! 3. `Oᵀ = V_chunkᵀ · P`: the 2022 library has no batch-matmul and no transpose
//!    operator, and a fully-connected operator only contracts its input's
//!    channels, so `P · V` needs V either as packed weights (repacked per call:
//!    XNNPACK packs at ~2.5–3 GB/s, 14–19× the time of reading them) or
//!    transposed as input. We transpose the chunk natively into an L2-resident
//!    scratch (`head_dim × CHUNK`) and create a second operator whose weights are
//!    `Pᵀ` (`[in = keys, out = rows]`, `XNN_FLAG_TRANSPOSE_WEIGHTS`; packing
//!    `rows × keys` floats, small for decode). The transpose (`transpose.rs`,
//!    in-register tiles) is the pass that streams V from memory; it also
//!    prefetches the next chunk's K into L2, so step 1 of that chunk computes
//!    from cache instead of stalling on its own cold stream.
//!
//! Where the time goes (decode): the transpose carries the K and V streams;
//! the two operators then compute from cache, and their microkernel fills 16
//! output lanes with a GQA group of 4 query rows, so their compute is not
//! hidden under the memory traffic the way the fused native kernel's is.
//! That serial compute is what keeps this backend near 2× the read floor.
//!
//! No packed copy of the pools is kept: `attend` is stateless over a spec, and
//! nothing in an [`AttendSpec`](crate::AttendSpec) tells whether a pool page
//! changed since an earlier call (rewind, ring overwrite, reuse of a cell), so
//! a cache keyed by pointer could serve stale K/V. A persistent packed-page cache
//! needs a write generation from the byte layer, and would double K/V memory.
//!
//! XNNPACK may read `XNN_EXTRA_BYTES` past an input. Inputs are our padded
//! scratch buffers, or K rows of the pool; a K chunk that ends within 16 bytes of
//! its head's slice has its last row copied into a padded buffer instead.
// Indices and arithmetic are bounded by the validated block geometry
// ("Arithmetic bounds" in validate.rs).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use super::colsoftmax::mask_softmax;
use super::geometry::Block;
use super::softmax::State;
use super::transpose::transpose;
use crate::dtype::KvDtype;
use crate::error::{CacheError, Result};
use std::cell::RefCell;
use std::ptr;
use std::sync::OnceLock;
use xnnpack_sys as x;

/// Keys per operator call.
const CHUNK: usize = 256;
const PAD: usize = x::XNN_EXTRA_BYTES / 4;

/// The pool dtypes this backend serves: float32 only. The library's f16
/// fully-connected operator takes f16 input *and* f16 output (no f32
/// accumulator output to fold an online softmax into), bfloat16 has no
/// operator at all, and its qs8 operator takes one scale per tensor, not
/// q8_0's scale per 32 values; serving those pools would need a dequantized
/// copy of the history, which the contract rules out. `auto` never picks
/// this backend.
pub(crate) fn check_dtypes(k: KvDtype, v: KvDtype) -> Result<()> {
    for (name, d) in [("K", k), ("V", v)] {
        if d != KvDtype::Float32 {
            return Err(CacheError::Backend(format!(
                "backend \"xnnpack\": expected float32 pools, got a {} {name} pool (this backend reads float32 rows in place only; use backend \"native\" or \"auto\")",
                d.name()
            )));
        }
    }
    Ok(())
}

/// Initialises XNNPACK once per process.
pub(crate) fn ensure_init() -> Result<()> {
    static INIT: OnceLock<x::xnn_status> = OnceLock::new();
    // SAFETY: a null allocator selects XNNPACK's default; called once.
    let s = *INIT.get_or_init(|| unsafe { x::xnn_initialize(ptr::null()) });
    check(s, "xnn_initialize")
}

fn check(s: x::xnn_status, what: &str) -> Result<()> {
    if s == x::xnn_status_success {
        Ok(())
    } else {
        Err(CacheError::Backend(format!(
            "{what}: expected xnn_status_success, got {} ({s})",
            x::status_name(s)
        )))
    }
}

/// An operator deleted on drop.
struct Op(x::xnn_operator_t);

impl Drop for Op {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful create and is deleted once.
        unsafe { x::xnn_delete_operator(self.0) };
    }
}

/// `create_fully_connected_nc_f32` with no bias and no clamp.
///
/// # Safety
/// `kernel` holds `cin * cout` floats.
unsafe fn fc(
    cin: usize,
    cout: usize,
    in_stride: usize,
    out_stride: usize,
    kernel: *const f32,
    flags: u32,
) -> Result<Op> {
    let mut op: x::xnn_operator_t = ptr::null_mut();
    // SAFETY: kernel size per the contract; op is a valid out pointer.
    let s = unsafe {
        x::xnn_create_fully_connected_nc_f32(
            cin,
            cout,
            in_stride,
            out_stride,
            kernel,
            ptr::null(),
            f32::NEG_INFINITY,
            f32::INFINITY,
            flags,
            &mut op,
        )
    };
    check(s, "xnn_create_fully_connected_nc_f32")?;
    Ok(Op(op))
}

/// Setup + run on the calling thread.
///
/// # Safety
/// `input` holds `batch` rows of the operator's input stride plus
/// `XNN_EXTRA_BYTES` readable bytes; `output` holds `batch` output rows.
unsafe fn fc_run(op: &Op, batch: usize, input: *const f32, output: *mut f32) -> Result<()> {
    // SAFETY: per the contract.
    let s =
        unsafe { x::xnn_setup_fully_connected_nc_f32(op.0, batch, input, output, ptr::null_mut()) };
    check(s, "xnn_setup_fully_connected_nc_f32")?;
    // SAFETY: the operator was set up just above.
    let s = unsafe { x::xnn_run_operator(op.0, ptr::null_mut()) };
    check(s, "xnn_run_operator")
}

#[derive(Default)]
struct XScratch {
    /// Sᵀ / Pᵀ, `CHUNK × rows` (+ pad).
    st: Vec<f32>,
    /// V chunk transposed, `hd × CHUNK` (+ pad).
    vt: Vec<f32>,
    /// Oᵀ, `hd × rows`.
    ot: Vec<f32>,
    /// One padded K row.
    row: Vec<f32>,
}

thread_local! {
    static XSCRATCH: RefCell<XScratch> = RefCell::new(XScratch::default());
}

/// Same contract as `kernel::run_block`, through XNNPACK operators.
pub(crate) fn run_block(b: &Block<'_>, st: &mut State<'_>) -> Result<()> {
    XSCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => run_block_in(b, st, &mut s),
        Err(_) => run_block_in(b, st, &mut XScratch::default()),
    })
}

fn run_block_in(b: &Block<'_>, st: &mut State<'_>, xs: &mut XScratch) -> Result<()> {
    let hd = b.hd;
    let nr = b.nr;
    let Some((lo_all, hi_all)) = b.key_span() else {
        return Ok(());
    };
    // Only float32 pools reach this backend (`check_dtypes`).
    let (bk, bv) = (b.k.f32().unwrap_or(&[]), b.v.f32().unwrap_or(&[]));
    xs.st.resize(CHUNK * nr + PAD, 0.0);
    xs.vt.resize(hd * CHUNK + PAD, 0.0);
    xs.ot.resize(hd * nr, 0.0);
    xs.row.resize(hd + PAD, 0.0);
    // SAFETY: qs holds nr * hd floats ([out = nr, in = hd]).
    let op1 = unsafe { fc(hd, nr, hd, nr, b.qs.as_ptr(), 0)? };
    let mut base = 0usize;
    for seg in b.segs {
        let seg_lo = base;
        let seg_hi = base + seg.len;
        base = seg_hi;
        let a = seg_lo.max(lo_all);
        let e = seg_hi.min(hi_all);
        let mut j = a;
        while j < e {
            let nc = CHUNK.min(e - j);
            let row0 = seg.start + (j - seg_lo);
            let kc = &bk[row0 * hd..(row0 + nc) * hd];
            // Rows whose XNN_EXTRA_BYTES over-read stays inside this head's K slice.
            let direct = if (row0 + nc) * hd + PAD <= bk.len() {
                nc
            } else {
                nc - 1
            };
            if direct > 0 {
                // SAFETY: kc has `direct` rows of hd floats plus >= PAD more floats of
                // the slice after them; st has CHUNK * nr floats.
                unsafe { fc_run(&op1, direct, kc.as_ptr(), xs.st.as_mut_ptr())? };
            }
            if direct < nc {
                xs.row[..hd].copy_from_slice(&kc[(nc - 1) * hd..]);
                // SAFETY: row has hd + PAD floats; the output row nc-1 is inside st.
                unsafe {
                    fc_run(
                        &op1,
                        1,
                        xs.row.as_ptr(),
                        xs.st[(nc - 1) * nr..].as_mut_ptr(),
                    )?
                };
            }
            let st_tile = &mut xs.st[..nc * nr];
            if let Some(cap) = b.softcap {
                cap.apply_slice(st_tile);
            }
            let any = mask_softmax(st_tile, nc, j, &b.lo[..nr], &b.hi[..nr], st, hd);
            if any {
                // Vᵀ chunk: vt[d * nc + jj] = V[row0 + jj][d].
                let vc = &bv[row0 * hd..(row0 + nc) * hd];
                // The next chunk's K, prefetched while V streams.
                let (j2, r2) = (j + nc, row0 + nc);
                let next = if j2 < e {
                    &bk[r2 * hd..(r2 + CHUNK.min(e - j2)) * hd]
                } else {
                    &[]
                };
                transpose(vc, nc, hd, &mut xs.vt, next);
                // SAFETY: st holds nc * nr floats = [in = nc, out = nr].
                let op2 = unsafe {
                    fc(
                        nc,
                        nr,
                        nc,
                        nr,
                        xs.st.as_ptr(),
                        x::XNN_FLAG_TRANSPOSE_WEIGHTS,
                    )?
                };
                // SAFETY: vt holds hd rows of nc floats plus PAD; ot holds hd * nr.
                unsafe { fc_run(&op2, hd, xs.vt.as_ptr(), xs.ot.as_mut_ptr())? };
                for r in 0..nr {
                    let acc = &mut st.acc[r * hd..(r + 1) * hd];
                    for (d, a) in acc.iter_mut().enumerate() {
                        *a += xs.ot[d * nr + r];
                    }
                }
            }
            j += nc;
        }
    }
    Ok(())
}
