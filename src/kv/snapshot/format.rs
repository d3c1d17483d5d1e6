//! The byte format shared by sequence and cell snapshots.
//!
//! All integers little-endian:
//!
//! ```text
//! magic      8   b"OKVSNAP\0"
//! version    u16 FORMAT_VERSION (a reader refuses a newer one)
//! kind       u8  0 = KvSequenceCache range, 1 = KvCellCache sequence,
//!                2 = KvCellCache sequence chunk (see chunk.rs)
//! flags      u8  0 (no flag is defined; a set bit is refused)
//! n_layers   u32
//! per layer  (the fingerprint: what makes rows compatible)
//!   policy u8 (LayerPolicy::code), window u64 (0 for flat),
//!   n_kv_heads u32, head_dim u32, k_dtype u8, v_dtype u8,
//!   k_row_bytes u32, v_row_bytes u32
//! state      kind-specific (positions, each at most MAX_POSITION =
//!            i64::MAX; see seq.rs and cell.rs)
//! rows       per layer: K as [heads][positions][k_row_bytes], then V alike
//! crc32      u32 over every byte before it (zlib's CRC-32)
//! ```
//!
//! Dtype codes: 0 float32, 1 float16, 2 bfloat16, 3 q8_0 (append-only). Rows
//! are stored as the pool stores them, never re-quantized.

use super::crc::crc32;
use crate::config::{LayerPolicy, MAX_LAYERS};
use crate::error::{CacheError, Result};

pub const MAGIC: [u8; 8] = *b"OKVSNAP\0";
/// The format this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// Largest position or range end a snapshot may carry (`i64::MAX`, so every
/// position fits Python's and numpy's int64 and C's `int64_t`); larger is
/// refused.
pub const MAX_POSITION: usize = i64::MAX as usize;
/// No flag is defined yet: a snapshot with any flag bit set is refused.
const KNOWN_FLAGS: u8 = 0;
pub(crate) const KIND_SEQ: u8 = 0;
pub(crate) const KIND_CELL: u8 = 1;
pub(crate) const KIND_CHUNK: u8 = 2;
/// magic, version, kind, flags, n_layers.
const HEADER: usize = 16;
/// Bytes of one layer's fingerprint.
const LAYER_PRINT: usize = 27;
const CRC: usize = 4;

/// One layer's fingerprint: what a row's bytes mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPrint {
    pub policy: LayerPolicy,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub k_dtype: u8,
    pub v_dtype: u8,
    pub k_row_bytes: usize,
    pub v_row_bytes: usize,
}

impl LayerPrint {
    /// Bytes of one position's K and V rows over every head.
    pub(crate) fn position_bytes(&self) -> Option<usize> {
        self.k_row_bytes
            .checked_add(self.v_row_bytes)?
            .checked_mul(self.n_kv_heads)
    }
}

pub(crate) fn snap_err(msg: impl Into<String>) -> CacheError {
    CacheError::Snapshot(msg.into())
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| snap_err(format!("{what} {v} does not fit the format's u32")))
}

/// Builds a snapshot; [`Writer::finish`] appends the checksum.
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn new(kind: u8, prints: &[LayerPrint], rows_hint: usize) -> Result<Self> {
        let mut w = Writer(Vec::with_capacity(
            HEADER
                .saturating_add(prints.len().saturating_mul(LAYER_PRINT))
                .saturating_add(rows_hint)
                .saturating_add(64),
        ));
        w.0.extend_from_slice(&MAGIC);
        w.0.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        w.u8(kind);
        w.u8(0);
        w.u32(to_u32(prints.len(), "n_layers")?);
        for p in prints {
            w.u8(p.policy.code());
            w.u64(p.policy.window().unwrap_or(0) as u64);
            w.u32(to_u32(p.n_kv_heads, "n_kv_heads")?);
            w.u32(to_u32(p.head_dim, "head_dim")?);
            w.u8(p.k_dtype);
            w.u8(p.v_dtype);
            w.u32(to_u32(p.k_row_bytes, "k_row_bytes")?);
            w.u32(to_u32(p.v_row_bytes, "v_row_bytes")?);
        }
        Ok(w)
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn pos(&mut self, v: usize) {
        self.u64(v as u64);
    }
    /// The buffer rows are appended to.
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let c = crc32(&self.0);
        self.0.extend_from_slice(&c.to_le_bytes());
        self.0
    }
}

/// Reads a checked snapshot body; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n);
        let s = end.and_then(|e| self.data.get(self.at..e)).ok_or_else(|| {
            snap_err(format!(
                "truncated: {what} needs {n} bytes at offset {}, {} left",
                self.at,
                self.remaining()
            ))
        })?;
        self.at = self.at.saturating_add(n);
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(u8::from_le_bytes(self.arr(what)?))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A position or a range end: at most [`MAX_POSITION`].
    pub(crate) fn pos(&mut self, what: &str) -> Result<usize> {
        let v = self.u64(what)?;
        usize::try_from(v)
            .ok()
            .filter(|p| *p <= MAX_POSITION)
            .ok_or_else(|| {
                snap_err(format!(
                    "{what} {v} is beyond the largest position a snapshot holds ({MAX_POSITION})"
                ))
            })
    }
    /// A u64 that must fit a `usize`.
    pub(crate) fn size(&mut self, what: &str) -> Result<usize> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| snap_err(format!("{what} {v} does not fit this platform")))
    }
    pub(crate) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.at)
    }
    /// Refuses bytes left over after the last field.
    pub(crate) fn end(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(snap_err(format!("{n} unexpected bytes after the rows"))),
        }
    }
}

/// Checks length, magic, version, checksum and kind; returns the reader past
/// the header and the layer fingerprints. Allocation is bounded by the data.
pub(crate) fn open(data: &[u8], kind: u8) -> Result<(Reader<'_>, Vec<LayerPrint>)> {
    let min = HEADER.saturating_add(CRC);
    if data.len() < min {
        return Err(snap_err(format!(
            "truncated: {} bytes, a snapshot has at least {min}",
            data.len()
        )));
    }
    if data.get(..8) != Some(&MAGIC[..]) {
        return Err(snap_err(
            "not an offgraph-kv snapshot (bad magic)".to_string(),
        ));
    }
    let (body, tail) = data.split_at(data.len().saturating_sub(CRC));
    let mut r = Reader { data: body, at: 8 };
    let version = u16::from_le_bytes(r.arr("version")?);
    if version > FORMAT_VERSION {
        return Err(snap_err(format!(
            "format version {version} is newer than this build reads ({FORMAT_VERSION})"
        )));
    }
    if version == 0 {
        return Err(snap_err("format version 0 is not a valid version"));
    }
    let mut c = [0u8; 4];
    c.copy_from_slice(tail);
    let stored = u32::from_le_bytes(c);
    let actual = crc32(body);
    if stored != actual {
        return Err(snap_err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x}): the data is damaged or truncated"
        )));
    }
    let got_kind = r.u8("kind")?;
    if got_kind != KIND_SEQ && got_kind != KIND_CELL && got_kind != KIND_CHUNK {
        return Err(snap_err(format!(
            "unknown kind {got_kind} (0 is a KvSequenceCache snapshot, 1 a KvCellCache sequence, 2 a KvCellCache sequence chunk)"
        )));
    }
    if got_kind != kind {
        let name = |k: u8| match k {
            KIND_SEQ => "a KvSequenceCache snapshot",
            KIND_CELL => "a KvCellCache sequence snapshot",
            KIND_CHUNK => "a KvCellCache sequence chunk",
            _ => "an unknown kind",
        };
        return Err(snap_err(format!(
            "kind {got_kind} is {}, expected {}",
            name(got_kind),
            name(kind)
        )));
    }
    let flags = r.u8("flags")?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(snap_err(format!(
            "unknown flags {flags:#04x} (this build knows {KNOWN_FLAGS:#04x})"
        )));
    }
    let n_layers = r.u32("n_layers")? as usize;
    if n_layers == 0
        || n_layers > MAX_LAYERS
        || n_layers.saturating_mul(LAYER_PRINT) > r.remaining()
    {
        return Err(snap_err(format!(
            "n_layers {n_layers} is out of range for a {}-byte snapshot",
            data.len()
        )));
    }
    let mut prints = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let code = r.u8("policy")?;
        let window = r.size("window")?;
        let policy = match (code, window) {
            (0, 0) => LayerPolicy::Flat,
            (1, w) if w > 0 => LayerPolicy::Ring { window: w },
            _ => {
                return Err(snap_err(format!(
                    "layer {i}: unknown policy code {code} with window {window}"
                )))
            }
        };
        prints.push(LayerPrint {
            policy,
            n_kv_heads: r.u32("n_kv_heads")? as usize,
            head_dim: r.u32("head_dim")? as usize,
            k_dtype: r.u8("k_dtype")?,
            v_dtype: r.u8("v_dtype")?,
            k_row_bytes: r.u32("k_row_bytes")? as usize,
            v_row_bytes: r.u32("v_row_bytes")? as usize,
        });
    }
    Ok((r, prints))
}

/// Refuses a snapshot of another model or layout, naming the first difference.
pub(crate) fn check_prints(found: &[LayerPrint], want: &[LayerPrint]) -> Result<()> {
    if found.len() != want.len() {
        return Err(snap_err(format!(
            "foreign snapshot: {} layers, this cache has {}",
            found.len(),
            want.len()
        )));
    }
    for (i, (f, w)) in found.iter().zip(want).enumerate() {
        if f != w {
            return Err(snap_err(format!(
                "foreign snapshot: layer {i} is {f:?}, this cache's is {w:?}"
            )));
        }
    }
    Ok(())
}
