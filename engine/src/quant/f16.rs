//! Half-precision decoding in software (bit-exact with the IEEE conversion
//! F16C does), for the portable paths and the block scales.

/// An IEEE binary16 value, as its bits, widened to f32 exactly.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal: man * 2^-24, exact in f32.
        (0, m) => {
            let v = (m as f32) * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// A bfloat16 value, as its bits, widened to f32 (exact: the high half).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// The little-endian u16 at the start of `b`.
#[inline(always)]
pub fn le16(b: [u8; 2]) -> u16 {
    u16::from_le_bytes(b)
}

/// The f16 scale stored little-endian in `b`.
#[inline(always)]
pub fn half(b: [u8; 2]) -> f32 {
    f16_to_f32(le16(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }
}
