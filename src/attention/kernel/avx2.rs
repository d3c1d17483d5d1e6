//! The AVX2 path: the portable kernel compiled with AVX2 and FMA enabled, so
//! its fixed-width loops autovectorise and `Portable<true>`'s `mul_add` is a
//! fused multiply-add.

use super::{run_block, Block, Portable, State};

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block_avx2(b: &Block<'_>, st: &mut State<'_>) {
    // SAFETY: the caller checked avx2 and fma; the block comes from a validated geometry.
    unsafe { run_block::<Portable<true>>(b, st) }
}
