//! Which instruction set runs the native kernel: chosen from the core's
//! detected CPU features (`crate::cpu`), and dispatched to the kernel
//! compiled for it.

use super::{run_block, Block, Portable, State};
use crate::attention::NativeIsa;
use crate::cpu::CpuFeatures;
use crate::error::{CacheError, Result};

/// The instruction set the native kernel runs with, as detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::attention) enum IsaPath {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx2Int8,
    Scalar,
}

/// The path for a requested ISA: `Auto` takes the best the CPU reports; a
/// forced one the CPU lacks is refused.
pub(in crate::attention) fn select_isa(want: NativeIsa) -> Result<IsaPath> {
    select_isa_on(want, crate::cpu::features())
}

/// [`select_isa`] on a CPU with `cpu`.
fn select_isa_on(want: NativeIsa, cpu: CpuFeatures) -> Result<IsaPath> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = cpu.avx512f;
        // The VNNI kernel is compiled for F, BW and VNNI only (no VL).
        let vnni = avx512 && cpu.avx512bw && cpu.avx512vnni;
        let avx2 = cpu.avx2_fma_f16c();
        match want {
            // VNNI only changes q8_0 keys, where it measured 0.72-1.00x the
            // register widening in 11 of 12 interleaved comparisons
            // (docs/attention-backends.md).
            NativeIsa::Auto if vnni => Ok(IsaPath::Avx512Vnni),
            NativeIsa::Auto if avx512 => Ok(IsaPath::Avx512),
            // The AVX2 integer dots (`vpmaddubsw`) likewise only change q8_0
            // keys of decode blocks, where they beat the widening call for
            // call on the AVX2 machine (benches/decode_floor.rs, docs/benchmarks.md).
            NativeIsa::Auto if avx2 => Ok(IsaPath::Avx2Int8),
            NativeIsa::Auto | NativeIsa::Scalar => Ok(IsaPath::Scalar),
            NativeIsa::Avx512 if avx512 => Ok(IsaPath::Avx512),
            NativeIsa::Avx512Vnni if vnni => Ok(IsaPath::Avx512Vnni),
            NativeIsa::Avx2 if avx2 => Ok(IsaPath::Avx2),
            NativeIsa::Avx2Int8 if avx2 => Ok(IsaPath::Avx2Int8),
            other => Err(CacheError::Backend(format!(
                "native ISA: expected one this CPU supports, got {other:?}"
            ))),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = cpu;
        match want {
            NativeIsa::Auto | NativeIsa::Scalar => Ok(IsaPath::Scalar),
            other => Err(CacheError::Backend(format!(
                "native ISA: expected one this CPU supports, got {other:?}"
            ))),
        }
    }
}

/// Runs one block with the kernel compiled for `isa`.
pub(in crate::attention) fn run_native(isa: IsaPath, b: &Block<'_>, st: &mut State<'_>) {
    match isa {
        // SAFETY: `select_isa` returned Avx512 only after detecting avx512f.
        #[cfg(target_arch = "x86_64")]
        IsaPath::Avx512 => unsafe { super::avx512::block_avx512(b, st) },
        // SAFETY: `select_isa` returned Avx512Vnni only after detecting avx512f, bw and vnni.
        #[cfg(target_arch = "x86_64")]
        IsaPath::Avx512Vnni => unsafe { super::avx512::block_avx512_vnni(b, st) },
        // SAFETY: `select_isa` returned Avx2 only after detecting avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        IsaPath::Avx2 => unsafe { super::avx2::block_avx2(b, st) },
        // SAFETY: `select_isa` returned Avx2Int8 only after detecting avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        IsaPath::Avx2Int8 => unsafe { super::avx2::block_avx2_int8(b, st) },
        // SAFETY: the portable kernel needs no CPU feature; the block comes from a validated geometry.
        IsaPath::Scalar => unsafe { run_block::<Portable<false>>(b, st) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU with the AVX2 set, and AVX-512 F/BW/VL/VNNI as asked.
    fn cpu(avx512f: bool, vnni: bool) -> CpuFeatures {
        let mut f = CpuFeatures::NONE;
        (f.avx, f.avx2, f.fma, f.f16c) = (true, true, true, true);
        (f.avx512f, f.avx512bw, f.avx512vl, f.avx512vnni) = (avx512f, avx512f, avx512f, vnni);
        f
    }

    #[test]
    fn auto_takes_the_best_and_forcing_what_is_missing_is_refused() {
        let refused = |want: NativeIsa| {
            Err(CacheError::Backend(format!(
                "native ISA: expected one this CPU supports, got {want:?}"
            )))
        };
        let none = CpuFeatures::NONE;
        assert_eq!(select_isa_on(NativeIsa::Auto, none), Ok(IsaPath::Scalar));
        assert_eq!(
            select_isa_on(NativeIsa::Scalar, cpu(true, true)),
            Ok(IsaPath::Scalar)
        );
        for want in [
            NativeIsa::Avx2,
            NativeIsa::Avx2Int8,
            NativeIsa::Avx512,
            NativeIsa::Avx512Vnni,
        ] {
            assert_eq!(select_isa_on(want, none), refused(want));
        }
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = cpu(false, false);
            assert_eq!(select_isa_on(NativeIsa::Auto, avx2), Ok(IsaPath::Avx2Int8));
            assert_eq!(select_isa_on(NativeIsa::Avx2, avx2), Ok(IsaPath::Avx2));
            assert_eq!(
                select_isa_on(NativeIsa::Avx512, avx2),
                refused(NativeIsa::Avx512)
            );
            let avx512 = cpu(true, false);
            assert_eq!(select_isa_on(NativeIsa::Auto, avx512), Ok(IsaPath::Avx512));
            assert_eq!(
                select_isa_on(NativeIsa::Avx512Vnni, avx512),
                refused(NativeIsa::Avx512Vnni)
            );
            assert_eq!(
                select_isa_on(NativeIsa::Auto, cpu(true, true)),
                Ok(IsaPath::Avx512Vnni)
            );
            // Without VL the VNNI kernel still runs: it is compiled for F, BW and VNNI.
            let mut no_vl = cpu(true, true);
            no_vl.avx512vl = false;
            assert_eq!(
                select_isa_on(NativeIsa::Auto, no_vl),
                Ok(IsaPath::Avx512Vnni)
            );
        }
    }
}
