//! Which kernels run the dots: detected once at first use and cached; a
//! caller may force one (`*_with_isa`), and `OKV_QUANT_ISA=portable` (or
//! `avx2`) caps what `Auto` takes for a whole process.

use crate::error::{EngineError, Result};
use std::sync::OnceLock;

/// A requested instruction set for the quantized dots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantIsa {
    /// The best the CPU has (AVX-512 VNNI, else AVX2+FMA+F16C, else portable).
    Auto,
    /// The portable integer code (any CPU).
    Portable,
    /// AVX2 with FMA and F16C; refused on a CPU without them.
    Avx2,
    /// AVX2's set plus AVX-512 F/BW/VL and VNNI (`vpdpbusd`, used on 256-bit
    /// registers); refused on a CPU without them.
    Avx512Vnni,
}

/// The resolved path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn auto() -> Path {
    static AUTO: OnceLock<Path> = OnceLock::new();
    *AUTO.get_or_init(|| {
        let cap = std::env::var("OKV_QUANT_ISA").unwrap_or_default();
        let cap = cap.to_ascii_lowercase();
        #[cfg(target_arch = "x86_64")]
        {
            if cap != "portable" && cap != "avx2" && has_vnni() {
                return Path::Vnni;
            }
            if cap != "portable" && has_avx2() {
                return Path::Avx2;
            }
        }
        let _ = cap;
        Path::Portable
    })
}

/// The path for `want`.
pub(super) fn select(want: QuantIsa) -> Result<Path> {
    match want {
        QuantIsa::Auto => Ok(auto()),
        QuantIsa::Portable => Ok(Path::Portable),
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx2 if has_avx2() => Ok(Path::Avx2),
        QuantIsa::Avx2 => Err(EngineError::Unsupported(
            "quantized dots: AVX2 (with FMA and F16C) requested, the CPU lacks it".into(),
        )),
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni if has_vnni() => Ok(Path::Vnni),
        QuantIsa::Avx512Vnni => Err(EngineError::Unsupported(
            "quantized dots: AVX-512 VNNI (with F/BW/VL, AVX2, FMA, F16C) requested, the CPU lacks it"
                .into(),
        )),
    }
}

/// What `Auto` runs on this machine.
pub fn active_isa() -> QuantIsa {
    match auto() {
        Path::Portable => QuantIsa::Portable,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => QuantIsa::Avx2,
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => QuantIsa::Avx512Vnni,
    }
}
