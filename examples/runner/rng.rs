//! The counter-based generator the Python demo uses (`demo_model.py`:
//! `_mix`, `stream_key`, `uniform`, `integers`), bit for bit.

pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
pub(crate) const TAG_EMB: u64 = 1;
pub(crate) const TAG_WQ: u64 = 2;
pub(crate) const TAG_WK: u64 = 3;
pub(crate) const TAG_WV: u64 = 4;
pub(crate) const TAG_WO: u64 = 5;
pub(crate) const TAG_PROMPT: u64 = 6;
pub(crate) const TAG_OUT: u64 = 7;

pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `stream_key(seed, tag, layer)`: Python's `& 0xFFFF_FFFF_FFFF_FFFF` of the
/// exact integer equals wrapping arithmetic modulo 2^64 (negative seeds too).
pub(crate) fn stream_key(seed: i64, tag: u64, layer: usize) -> u64 {
    let raw = (seed as u64)
        .wrapping_mul(0x0100_0000_01B3)
        .wrapping_add(tag.wrapping_mul(0x10001))
        .wrapping_add((layer as u64).wrapping_mul(0x101));
    mix(raw)
}

/// The i-th raw value of a stream (i counts from 0; the stream from 1).
pub(crate) fn bits(key: u64, i: usize) -> u64 {
    mix(key.wrapping_add((i as u64 + 1).wrapping_mul(GOLDEN)))
}

/// `uniform(key, n)`: float64 in [-1, 1).
pub(crate) fn uniform(key: u64, n: usize) -> impl Iterator<Item = f64> {
    (0..n).map(move |i| (bits(key, i) >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0)
}

pub(crate) fn integers(key: u64, n: usize, bound: usize) -> Vec<usize> {
    (0..n)
        .map(|i| (bits(key, i) % bound as u64) as usize)
        .collect()
}
