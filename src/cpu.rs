//! The x86-64 features the kernels are compiled for, detected once per
//! process and cached: attention's ISA choice and the engine's quantized
//! dots read the same answer. Elsewhere every flag is false, so callers run
//! their portable code.
//!
//! [`CpuFeatures::capped`] lowers what a caller's `Auto` may take (`"portable"`,
//! `"avx2"`): the parse behind the engine's `OKV_QUANT_ISA`. A forced ISA
//! checks [`features`] itself, uncapped.

use std::sync::OnceLock;

/// What the CPU reports, one flag per feature some kernel is compiled for.
///
/// `#[non_exhaustive]`: build one from [`CpuFeatures::NONE`] and set fields
/// (tests of a selection on a CPU this machine is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CpuFeatures {
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
}

/// This CPU's features: detected at the first call, the same value after.
#[inline]
pub fn features() -> CpuFeatures {
    static DETECTED: OnceLock<CpuFeatures> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    use std::arch::is_x86_feature_detected as has;
    CpuFeatures {
        avx: has!("avx"),
        avx2: has!("avx2"),
        fma: has!("fma"),
        f16c: has!("f16c"),
        avx512f: has!("avx512f"),
        avx512bw: has!("avx512bw"),
        avx512vl: has!("avx512vl"),
        avx512vnni: has!("avx512vnni"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuFeatures {
    CpuFeatures::NONE
}

impl CpuFeatures {
    /// No feature: what the portable code needs.
    pub const NONE: CpuFeatures = CpuFeatures {
        avx: false,
        avx2: false,
        fma: false,
        f16c: false,
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        avx512vnni: false,
    };

    /// AVX2 and FMA (the float loops compiled `avx2,fma`).
    #[inline]
    pub fn avx2_fma(self) -> bool {
        self.avx2 && self.fma
    }

    /// AVX2, FMA and F16C: the set every AVX2 kernel of attention and of the
    /// quantized dots is compiled for.
    #[inline]
    pub fn avx2_fma_f16c(self) -> bool {
        self.avx2_fma() && self.f16c
    }

    /// AVX-512 F, BW, VL and VNNI with the AVX2 set: what the quantized
    /// dots' VNNI kernels are compiled for (`vpdpbusd` on 256-bit registers).
    #[inline]
    pub fn avx512_vnni(self) -> bool {
        self.avx2_fma_f16c() && self.avx512f && self.avx512bw && self.avx512vl && self.avx512vnni
    }

    /// These features with everything above `cap` cleared: `"portable"`
    /// clears all, `"avx2"` the AVX-512 ones (ASCII case ignored). Any other
    /// value, the empty string included, is no cap: a misspelt cap runs the
    /// best the CPU has rather than stopping a process.
    pub fn capped(self, cap: &str) -> CpuFeatures {
        if cap.eq_ignore_ascii_case("portable") {
            CpuFeatures::NONE
        } else if cap.eq_ignore_ascii_case("avx2") {
            CpuFeatures {
                avx512f: false,
                avx512bw: false,
                avx512vl: false,
                avx512vnni: false,
                ..self
            }
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> CpuFeatures {
        CpuFeatures {
            avx: true,
            avx2: true,
            fma: true,
            f16c: true,
            avx512f: true,
            avx512bw: true,
            avx512vl: true,
            avx512vnni: true,
        }
    }

    #[test]
    fn detection_is_cached_and_agrees_with_std() {
        let f = features();
        assert_eq!(features(), f);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(f.avx2, std::arch::is_x86_feature_detected!("avx2"));
            assert_eq!(f.f16c, std::arch::is_x86_feature_detected!("f16c"));
            assert_eq!(f.avx512vl, std::arch::is_x86_feature_detected!("avx512vl"));
            assert_eq!(
                f.avx512vnni,
                std::arch::is_x86_feature_detected!("avx512vnni")
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(f, CpuFeatures::NONE);
    }

    #[test]
    fn composites_need_every_member() {
        assert!(all().avx512_vnni() && all().avx2_fma_f16c() && all().avx2_fma());
        assert!(!CpuFeatures::NONE.avx2_fma());
        let mut f = all();
        f.f16c = false;
        assert!(f.avx2_fma() && !f.avx2_fma_f16c() && !f.avx512_vnni());
        let mut f = all();
        f.avx512vl = false;
        assert!(f.avx2_fma_f16c() && !f.avx512_vnni());
    }

    #[test]
    fn caps_clear_what_is_above_them() {
        assert_eq!(all().capped("portable"), CpuFeatures::NONE);
        assert_eq!(all().capped("PORTABLE"), CpuFeatures::NONE);
        let avx2 = all().capped("Avx2");
        assert!(avx2.avx2_fma_f16c() && avx2.avx);
        assert!(!(avx2.avx512f || avx2.avx512bw || avx2.avx512vl || avx2.avx512vnni));
        for none in ["", "avx512", "vnni", " portable"] {
            assert_eq!(all().capped(none), all(), "{none:?}");
        }
    }
}
