//! Which kernels run the dots: the core's detected CPU features
//! (`offgraph_kv::cpu`), the choice for `Auto` made once and cached; a
//! caller may force one (`*_with_isa`), and `OKV_QUANT_ISA=portable` (or
//! `avx2`) caps what `Auto` takes for a whole process.

use crate::error::{EngineError, Result};
use offgraph_kv::cpu::{features, CpuFeatures};
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

/// The best path `cpu` runs.
fn best(cpu: CpuFeatures) -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        if cpu.avx512_vnni() {
            return Path::Vnni;
        }
        if cpu.avx2_fma_f16c() {
            return Path::Avx2;
        }
    }
    let _ = cpu;
    Path::Portable
}

fn auto() -> Path {
    static AUTO: OnceLock<Path> = OnceLock::new();
    *AUTO.get_or_init(|| {
        let cap = std::env::var("OKV_QUANT_ISA").unwrap_or_default();
        best(features().capped(&cap))
    })
}

/// The path for `want`.
pub(super) fn select(want: QuantIsa) -> Result<Path> {
    select_on(want, features())
}

/// The path for `want` on a CPU with `cpu` (`Auto` cached, from the
/// process's own CPU and cap).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn select_on(want: QuantIsa, cpu: CpuFeatures) -> Result<Path> {
    match want {
        QuantIsa::Auto => Ok(auto()),
        QuantIsa::Portable => Ok(Path::Portable),
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx2 if cpu.avx2_fma_f16c() => Ok(Path::Avx2),
        QuantIsa::Avx2 => Err(EngineError::Unsupported(
            "quantized dots: AVX2 (with FMA and F16C) requested, the CPU lacks it".into(),
        )),
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni if cpu.avx512_vnni() => Ok(Path::Vnni),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU with the AVX2 set and, when `vnni`, AVX-512 F/BW/VL/VNNI.
    fn cpu(vnni: bool) -> CpuFeatures {
        let mut f = CpuFeatures::NONE;
        (f.avx, f.avx2, f.fma, f.f16c) = (true, true, true, true);
        (f.avx512f, f.avx512bw, f.avx512vl, f.avx512vnni) = (vnni, vnni, vnni, vnni);
        f
    }

    #[test]
    fn auto_takes_the_best_under_the_cap() {
        assert_eq!(best(CpuFeatures::NONE), Path::Portable);
        assert_eq!(best(cpu(true).capped("portable")), Path::Portable);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(best(cpu(true)), Path::Vnni);
            assert_eq!(best(cpu(true).capped("AVX2")), Path::Avx2);
            assert_eq!(best(cpu(false)), Path::Avx2);
            let mut no_vl = cpu(true);
            no_vl.avx512vl = false;
            assert_eq!(best(no_vl), Path::Avx2);
        }
    }

    #[test]
    fn a_forced_isa_the_cpu_lacks_is_refused() {
        let lacks = |m: &str| Err(EngineError::Unsupported(format!("quantized dots: {m}")));
        let none = CpuFeatures::NONE;
        assert_eq!(select_on(QuantIsa::Portable, none), Ok(Path::Portable));
        assert_eq!(
            select_on(QuantIsa::Avx2, none),
            lacks("AVX2 (with FMA and F16C) requested, the CPU lacks it")
        );
        let vnni = "AVX-512 VNNI (with F/BW/VL, AVX2, FMA, F16C) requested, the CPU lacks it";
        assert_eq!(select_on(QuantIsa::Avx512Vnni, cpu(false)), lacks(vnni));
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(select_on(QuantIsa::Avx2, cpu(false)), Ok(Path::Avx2));
            assert_eq!(select_on(QuantIsa::Avx512Vnni, cpu(true)), Ok(Path::Vnni));
        }
    }
}
