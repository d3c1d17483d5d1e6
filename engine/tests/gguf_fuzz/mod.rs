//! The check the `gguf_header` fuzz target runs on arbitrary bytes, shared
//! with the stable replay test (`tests/gguf_fuzz_replay.rs`): parsing never
//! panics, and a header that parses describes tensors that all lie inside
//! the bytes, with sizes that agree with their types and shapes.
#![allow(dead_code)]

use offgraph_kv_engine::gguf::{parse_header, GgufFile, Header};
use offgraph_kv_engine::{EngineError, GgmlType};

/// Parses `data`; on success checks every tensor's range and reads it.
/// Returns the number of tensors, or the refusal. Panics only when the
/// loader broke one of its own promises.
pub fn run(data: &[u8]) -> Result<usize, EngineError> {
    let header = parse_header(data)?;
    check_header(&header, data);
    let file = match GgufFile::from_bytes(data.to_vec()) {
        Ok(f) => f,
        Err(e) => panic!("parse_header accepted what from_bytes refused: {e}"),
    };
    // Compared as printed: a NaN metadata value is the same parse but never
    // equal to itself under `PartialEq`.
    assert_eq!(
        format!("{:?}", file.header()),
        format!("{header:?}"),
        "from_bytes parsed differently"
    );
    for info in file.tensors() {
        let Some(t) = file.get_tensor(&info.name) else {
            panic!("tensor {:?} listed but not readable", info.name)
        };
        assert_eq!(t.data.len() as u64, info.nbytes);
        let start = info.offset as usize;
        assert_eq!(Some(t.data), data.get(start..start + info.nbytes as usize));
        match (info.ty, t.to_f32()) {
            (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16, Ok(v)) => {
                assert_eq!(v.len() as u64, info.n_elements(), "{}", info.name)
            }
            (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16, Err(e)) => {
                panic!("float tensor {:?} not readable: {e}", info.name)
            }
            (_, Ok(_)) => panic!("to_f32 read quantized tensor {:?}", info.name),
            (_, Err(_)) => {}
        }
    }
    Ok(header.tensors.len())
}

fn check_header(h: &Header, data: &[u8]) {
    let len = data.len() as u64;
    assert!(matches!(h.version, 2 | 3));
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_offset % h.alignment, 0);
    let mut ranges = Vec::new();
    for t in &h.tensors {
        assert!((1..=4).contains(&t.dims.len()), "{:?}", t.dims);
        assert!(t.dims.iter().all(|&d| d >= 1));
        let elements = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        assert_eq!(elements, Some(t.n_elements()));
        assert_eq!(t.rows() * t.dims[0], t.n_elements());
        let row = t.ty.row_bytes(t.dims[0]).expect("dims[0] is whole blocks");
        assert_eq!(Some(t.nbytes), row.checked_mul(t.rows()));
        assert!(t.offset >= h.data_offset);
        assert_eq!((t.offset - h.data_offset) % h.alignment, 0);
        let end = t.offset.checked_add(t.nbytes).expect("end fits");
        assert!(end <= len, "{} ends at {end} past {len}", t.name);
        ranges.push((t.offset, end));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "tensors overlap: {w:?}");
    }
}
