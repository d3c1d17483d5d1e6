//! Which kernels run the dots: detected once at first use and cached; a
//! caller may force one (`*_with_isa`), and `OKV_QUANT_ISA=portable` makes
//! `Auto` take the portable path for a whole process.

use crate::error::{EngineError, Result};
use std::sync::OnceLock;

/// A requested instruction set for the quantized dots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantIsa {
    /// The best the CPU has (AVX2+FMA+F16C, else portable).
    Auto,
    /// The portable integer code (any CPU).
    Portable,
    /// AVX2 with FMA and F16C; refused on a CPU without them.
    Avx2,
}

/// The resolved path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
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

fn auto() -> Path {
    static AUTO: OnceLock<Path> = OnceLock::new();
    *AUTO.get_or_init(|| {
        let forced =
            std::env::var("OKV_QUANT_ISA").is_ok_and(|v| v.eq_ignore_ascii_case("portable"));
        match has_avx2() && !forced {
            #[cfg(target_arch = "x86_64")]
            true => Path::Avx2,
            _ => Path::Portable,
        }
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
    }
}

/// What `Auto` runs on this machine.
pub fn active_isa() -> QuantIsa {
    match auto() {
        Path::Portable => QuantIsa::Portable,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => QuantIsa::Avx2,
    }
}
