//! An opened GGUF file: the read-only mapping (or, for tests, owned bytes),
//! its checked header and tensors read in place.

use super::header::{parse_header, Header, TensorInfo};
use super::value::Metadata;
use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;
use memmap2::Mmap;
use offgraph_kv::half::{bf16_to_f32, f16_to_f32};
use std::collections::HashMap;
use std::path::Path;

enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A GGUF file whose header has been checked; tensors borrow its bytes.
pub struct GgufFile {
    backing: Backing,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("file_len", &self.file_len())
            .field("tensors", &self.header.tensors.len())
            .field("metadata_keys", &self.header.metadata.entries.len())
            .finish()
    }
}

/// Prefixes an error's message with the file it came from.
fn in_file(path: &Path, e: EngineError) -> EngineError {
    let p = path.display();
    match e {
        EngineError::Format(m) => EngineError::Format(format!("{p}: {m}")),
        EngineError::Unsupported(m) => EngineError::Unsupported(format!("{p}: {m}")),
        EngineError::Model(m) => EngineError::Model(format!("{p}: {m}")),
        EngineError::Io(m) => EngineError::Io(format!("{p}: {m}")),
        other => other,
    }
}

impl GgufFile {
    /// Maps `path` read-only and checks its header.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |what: &str, e: std::io::Error| {
            EngineError::Io(format!("{}: {what}: {e}", path.display()))
        };
        let file = std::fs::File::open(path).map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        let backing = if len == 0 {
            // An empty mapping is refused by some systems; the header check
            // refuses the empty file with a Format error either way.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only and private to this process;
            // the engine's contract is that model files are not modified
            // while open (a truncation under us would be a SIGBUS, as with
            // any mapped model file).
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&file) }.map_err(|e| io("mmap", e))?;
            Backing::Map(map)
        };
        Self::from_backing(backing).map_err(|e| in_file(path, e))
    }

    /// The same checks over bytes held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile> {
        let header = parse_header(backing.bytes())?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            backing,
            header,
            by_name,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Moves the metadata out, leaving none, for a holder that keeps the file
    /// only for its tensors: a 262,144-token vocabulary held as values is
    /// about 30 MiB of heap for as long as the file lives.
    pub fn take_metadata(&mut self) -> Metadata {
        std::mem::take(&mut self.header.metadata)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.header.metadata.str("general.architecture")
    }

    /// The tensor named `name`, if the file has one.
    pub fn get_tensor(&self, name: &str) -> Option<Tensor<'_>> {
        let info = self.header.tensors.get(*self.by_name.get(name)?)?;
        let start = usize::try_from(info.offset).ok()?;
        let end = start.checked_add(usize::try_from(info.nbytes).ok()?)?;
        let data = self.bytes().get(start..end)?;
        Some(Tensor { info, data })
    }

    /// The tensor named `name`; `Model` when the file has none.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        self.get_tensor(name)
            .ok_or_else(|| EngineError::Model(format!("tensor {name:?}: missing")))
    }

    pub fn file_len(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Drops the resident pages of tensor `name` (the whole pages inside its
    /// bytes) once a copy serves its reads: they stay valid, and a later read
    /// faults them in again from the file. A no-op for owned bytes, an
    /// unknown tensor, or where the OS refuses.
    pub fn release_tensor(&self, name: &str) {
        let (Backing::Map(map), Some(t)) = (&self.backing, self.get_tensor(name)) else {
            return;
        };
        let page = 4096;
        let base = map.as_ptr() as usize;
        let start = t.data.as_ptr() as usize - base;
        let lo = start.next_multiple_of(page);
        let hi = (start + t.data.len()) / page * page;
        if hi > lo {
            // SAFETY: the mapping is read-only and backed by the file, which
            // the engine's contract keeps unmodified while open, so dropping
            // its pages changes no byte a borrow can see: the next read
            // faults the same bytes in again. The range is inside the mapping.
            #[cfg(unix)]
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
            };
        }
    }
}

/// A tensor's info and its data, exactly `info.nbytes` bytes of the file.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> Tensor<'a> {
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Bytes of one row (`dims[0]` values in the tensor's type).
    pub fn row_bytes(&self) -> u64 {
        self.info.nbytes / self.info.rows().max(1)
    }

    /// Row `i`'s bytes; `InvalidArgument` past the last row.
    pub fn row(&self, i: u64) -> Result<&'a [u8]> {
        let rb = self.row_bytes();
        let rows = self.info.rows();
        let range = (i < rows)
            .then(|| i.checked_mul(rb))
            .flatten()
            .and_then(|s| Some(usize::try_from(s).ok()?..usize::try_from(s + rb).ok()?));
        range.and_then(|r| self.data.get(r)).ok_or_else(|| {
            EngineError::InvalidArgument(format!("tensor {:?}: row {i} of {rows}", self.info.name))
        })
    }

    /// `Model` naming the tensor when its dimensions are not `dims`.
    pub fn expect_shape(&self, dims: &[u64]) -> Result<()> {
        if self.info.dims == dims {
            Ok(())
        } else {
            Err(EngineError::Model(format!(
                "tensor {:?}: expected shape {dims:?}, got {:?} ({})",
                self.info.name,
                self.info.dims,
                self.info.ty.name()
            )))
        }
    }

    /// The values of an F32, F16 or BF16 tensor (norm weights) as f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        // chunks_exact gives slices of exactly the width, so try_into never fails.
        let pairs = || {
            self.data
                .chunks_exact(2)
                .filter_map(|c| c.try_into().ok().map(u16::from_le_bytes))
        };
        match self.info.ty {
            GgmlType::F32 => Ok(self
                .data
                .chunks_exact(4)
                .filter_map(|c| c.try_into().ok().map(f32::from_le_bytes))
                .collect()),
            GgmlType::F16 => Ok(pairs().map(f16_to_f32).collect()),
            GgmlType::BF16 => Ok(pairs().map(bf16_to_f32).collect()),
            other => Err(EngineError::Unsupported(format!(
                "tensor {:?}: to_f32 reads F32, F16 or BF16 tensors, this one is {}",
                self.info.name,
                other.name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_tensors_can_be_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<GgufFile>();
        shared::<Tensor<'static>>();
    }
}
