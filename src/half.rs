//! Half-precision numbers as their bits: IEEE binary16 (`f16`) and bfloat16
//! (`bf16`) to and from f32, in software. The pools' dtypes, the GGUF
//! weights and block scales all convert here.
//!
//! * Widening is exact. A signalling f16 NaN comes back quiet with its
//!   payload, as IEEE 754 and F16C's `vcvtph2ps` do, so the portable paths
//!   and the F16C kernels give the same bits for every input. bfloat16
//!   widens by a shift (payloads kept as they are, as every kernel does).
//! * Narrowing rounds to nearest even; NaN stays a quiet NaN (its payload's
//!   top bits), overflow goes to infinity (F16C's `vcvtps2ph` with
//!   round-to-nearest gives the same bits).

/// IEEE half bits to f32 (exact; a signalling NaN comes back quiet).
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
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | (e.wrapping_add(112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The f16 stored little-endian in `b` (a block scale), as f32.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

/// bfloat16 bits to f32 (exact: the high half).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 to IEEE half bits, round to nearest even; NaN stays NaN (quiet),
/// overflow goes to infinity.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x0200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    // Unbiased exponent of x; half normals cover [-14, 15].
    let e = exp.saturating_sub(127);
    if e > 15 {
        return sign | 0x7c00;
    }
    if e >= -14 {
        // Normal half: keep 10 mantissa bits, round the 13 dropped ones to nearest even.
        let he = (e.saturating_add(15) as u32) << 10;
        let hm = man >> 13;
        let rest = man & 0x1fff;
        let mut h = he | hm;
        if rest > 0x1000 || (rest == 0x1000 && (hm & 1) == 1) {
            h = h.saturating_add(1); // a carry into the exponent is correct (up to inf)
        }
        return sign | h as u16;
    }
    if e < -25 {
        return sign; // below half the smallest subnormal: rounds to zero
    }
    // Subnormal half: value = m * 2^-24 with the implicit bit restored.
    let full = man | 0x80_0000;
    let shift = (-14i32).saturating_sub(e).saturating_add(13) as u32; // 14..=24
    let hm = full >> shift;
    let rest = full & ((1u32 << shift).saturating_sub(1));
    let half = 1u32 << shift.saturating_sub(1);
    let mut h = hm;
    if rest > half || (rest == half && (hm & 1) == 1) {
        h = h.saturating_add(1);
    }
    sign | h as u16
}

/// f32 to bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fffu32.saturating_add((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    /// Every half against its definition, worked in f64: `m * 2^-24` below
    /// the normals, `(1024 + m) * 2^(e - 25)` above; NaN quiet with its payload.
    #[test]
    fn every_half_widens_to_its_value() {
        for h in 0..=u16::MAX {
            let (neg, e, m) = (
                h & 0x8000 != 0,
                i32::from((h >> 10) & 0x1f),
                f64::from(h & 0x3ff),
            );
            let got = f16_to_f32(h);
            let sign = if neg { 0x8000_0000 } else { 0 };
            if e == 0x1f && m != 0.0 {
                let want = sign | 0x7fc0_0000 | (u32::from(h & 0x3ff) << 13);
                assert_eq!(got.to_bits(), want, "half {h:#06x}");
                continue;
            }
            let mag = match e {
                0 => m * 2f64.powi(-24),
                0x1f => f64::INFINITY,
                _ => (1024.0 + m) * 2f64.powi(e - 25),
            };
            assert_eq!(
                f64::from(got),
                if neg { -mag } else { mag },
                "half {h:#06x}"
            );
            assert_eq!(got.is_sign_negative(), neg, "half {h:#06x}");
        }
    }

    #[test]
    fn known_values() {
        let cases: [(u16, f32); 10] = [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0001, 5.960_464_5e-8),
            (0x8001, -5.960_464_5e-8),
            (0x03ff, 6.097_555e-5),
            (0x0400, 6.103_515_6e-5),
            (0x7c00, f32::INFINITY),
        ];
        for (h, want) in cases {
            assert_eq!(f16_to_f32(h), want, "{h:#06x}");
        }
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7e00).to_bits(), 0x7fc0_0000);
        assert_eq!(f16_to_f32(0xfc01).to_bits(), 0xffc0_2000); // signalling, quieted
        assert_eq!(f16_le([0x00, 0x3c]), 1.0);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn f16_round_trip_of_every_half_is_exact() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                // Quiet NaNs come back as they were; signalling ones quiet.
                assert_eq!(f32_to_f16(x), h | 0x0200, "half {h:#06x}");
            } else {
                assert_eq!(f32_to_f16(x), h, "half {h:#06x}");
            }
        }
    }

    #[test]
    fn f16_rounds_ties_to_even() {
        // 1 + 2^-11 is halfway between 1 and the next half: even is 1.0.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: rounds up.
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0); // tie to even zero
        assert_eq!(f32_to_f16(f32::powi(2.0, -25) * 1.5), 1);
    }

    #[test]
    fn bf16_rounds_ties_to_even() {
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    /// The software conversions give F16C's bits: every half widened, and
    /// f32s across every exponent (a stride through all bit patterns, plus
    /// each half's neighbours and midpoints) narrowed.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn conversions_match_f16c() {
        use std::arch::x86_64::*;
        #[target_feature(enable = "f16c")]
        fn widen(h: u16) -> f32 {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(h as i16)))
        }
        #[target_feature(enable = "f16c")]
        fn narrow(x: f32) -> u16 {
            _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16
        }
        if !crate::cpu::features().f16c {
            return; // nothing to compare against on this CPU
        }
        for h in 0..=u16::MAX {
            // SAFETY: f16c detected just above.
            let hw = unsafe { widen(h) };
            assert_eq!(f16_to_f32(h).to_bits(), hw.to_bits(), "half {h:#06x}");
            let b = hw.to_bits();
            for x in [
                b,
                b.wrapping_add(1),
                b.wrapping_sub(1),
                b.wrapping_add(1 << 12),
            ] {
                let x = f32::from_bits(x);
                // SAFETY: as above.
                assert_eq!(
                    f32_to_f16(x),
                    unsafe { narrow(x) },
                    "f32 {:#010x}",
                    x.to_bits()
                );
            }
        }
        for b in (0..=u32::MAX).step_by(4099) {
            let x = f32::from_bits(b);
            // SAFETY: as above.
            assert_eq!(f32_to_f16(x), unsafe { narrow(x) }, "f32 {b:#010x}");
        }
    }
}
