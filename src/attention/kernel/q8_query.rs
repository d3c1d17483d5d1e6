//! The query's Q8_0 blocks for the integer-dot kernels (AVX2 and AVX-512
//! VNNI): each lays the blocks out its own way, both round them here.

/// One row's blocks of 32: `q = round(x / d)` with `d = max|x| / 127`, each
/// block's `d` written (unaligned) to `scales[b]`. The AVX2 int8
/// kernel stores them as they are; the VNNI one adds correction terms after
/// them.
///
/// # Safety
/// `scales` has room for `x.len() / 32` f32 values.
#[inline(always)]
pub(super) unsafe fn quantize_blocks(x: &[f32], q: &mut [i8], scales: *mut f32) {
    for (b, (xb, qb)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (qv, xv) in qb.iter_mut().zip(xb) {
            *qv = (xv * id).round() as i8;
        }
        // SAFETY: b < x.len() / 32, within `scales` per the contract.
        unsafe { scales.add(b).write_unaligned(d) };
    }
}
