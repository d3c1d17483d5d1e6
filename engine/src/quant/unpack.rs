//! Unpacking the bit fields of GGML blocks: what block decoding
//! (`dequant.rs`, `lowbit.rs`) and the portable and AVX2 dots share, below
//! all of them.

/// Byte `i` of `a`, 0 past its end (only used with in-range constants).
#[inline(always)]
pub(super) fn at(a: &[u8], i: usize) -> u8 {
    a.get(i).copied().unwrap_or(0)
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block, from its 12
/// packed bytes: sub-blocks 0..4 keep their low 6 bits in bytes 0..4 (scale)
/// and 4..8 (min); sub-blocks 4..8 take a nibble of bytes 8..12 and the top
/// two bits of bytes 0..8.
#[inline(always)]
pub(super) fn scale_min_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let sc = core::array::from_fn(|j| {
        if j < 4 {
            at(s, j) & 63
        } else {
            (at(s, j + 4) & 0x0f) | ((at(s, j - 4) >> 6) << 4)
        }
    });
    let mn = core::array::from_fn(|j| {
        if j < 4 {
            at(s, j + 4) & 63
        } else {
            (at(s, j + 4) >> 4) | ((at(s, j) >> 6) << 4)
        }
    });
    (sc, mn)
}

/// Low nibbles of `qs` (16 bytes) are values 0..16 of a 32-block, high
/// nibbles values 16..32; `hbits` supplies bit 4 of each value (0 for 4-bit
/// types). Returns the 32 unsigned quants.
#[inline(always)]
pub(super) fn unpack32(qs: &[u8], hbits: u32) -> [u8; 32] {
    core::array::from_fn(|j| {
        let b = at(qs, j % 16);
        let lo = if j < 16 { b & 0x0f } else { b >> 4 };
        lo | ((((hbits >> j) & 1) as u8) << 4)
    })
}

/// Value `r` (0..128) of half `h` of a Q6_K super-block: 4 low bits from
/// `ql` (bytes 0..64 of the half, low nibbles then high nibbles), 2 high bits
/// from `qh` (32 bytes of the half, four 2-bit fields).
#[inline(always)]
pub(super) fn q6(ql: &[u8], qh: &[u8], h: usize, r: usize) -> u8 {
    let lo = (at(ql, h * 64 + r % 64) >> (4 * (r / 64))) & 0x0f;
    let hi = (at(qh, h * 32 + r % 32) >> (2 * (r / 32))) & 3;
    lo | (hi << 4)
}
