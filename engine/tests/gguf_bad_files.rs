//! The GGUF loader over files written by a small test writer: a valid file
//! round-trips, and every malformed file in the matrix is refused with the
//! right error variant and a message naming what and where.

mod gguf_writer;

use gguf_writer::{f32_bytes, small_valid, ty, Built, GgufBuilder, TensorSpec, NORM};
use offgraph_kv_engine::gguf::{parse_header, GgufFile, Value, MAX_ARRAY_DEPTH};
use offgraph_kv_engine::{EngineError, GgmlType};

fn format_msg(r: Result<impl std::fmt::Debug, EngineError>) -> String {
    match r {
        Err(EngineError::Format(m)) => m,
        other => panic!("expected a Format error, got {other:?}"),
    }
}

fn unsupported_msg(r: Result<impl std::fmt::Debug, EngineError>) -> String {
    match r {
        Err(EngineError::Unsupported(m)) => m,
        other => panic!("expected an Unsupported error, got {other:?}"),
    }
}

fn refuse_format(b: &GgufBuilder) -> String {
    let Built { bytes, .. } = b.build();
    // The in-memory file runs the same checks.
    let m = format_msg(GgufFile::from_bytes(bytes.clone()).map(|_| ()));
    assert_eq!(format_msg(parse_header(&bytes).map(|_| ())), m);
    m
}

fn with_tensor(t: TensorSpec) -> GgufBuilder {
    GgufBuilder::default()
        .kv("general.architecture", Value::String("x".into()))
        .tensor(TensorSpec::new(
            "ok.weight",
            &[4],
            ty::F32,
            f32_bytes(&[1.0; 4]),
        ))
        .tensor(t)
}

#[test]
fn valid_file_round_trips_metadata_and_tensor_data() {
    let b = small_valid();
    let built = b.build();
    let f = GgufFile::from_bytes(built.bytes.clone()).expect("valid file");
    assert_eq!(f.version(), 3);
    assert_eq!(f.file_len(), built.bytes.len() as u64);
    assert_eq!(f.bytes(), &built.bytes[..]);
    assert_eq!(f.architecture().ok(), Some("testarch"));
    assert_eq!(f.header().alignment, 32);
    assert_eq!(f.header().data_offset, built.data_offset);
    assert_eq!(f.metadata().entries.len(), b.kvs.len());
    for (k, v) in &b.kvs {
        assert_eq!(f.metadata().get(k), Some(v), "{k}");
    }
    assert_eq!(f.metadata().u64("t.u32").ok(), Some(4_000_000_000));
    assert_eq!(f.metadata().str("t.string").ok(), Some("héllo wörld ✓"));
    assert_eq!(f.tensors().len(), b.tensors.len());
    for ((spec, info), &at) in b.tensors.iter().zip(f.tensors()).zip(&built.placed) {
        assert_eq!(info.name, spec.name);
        assert_eq!(info.dims, spec.dims);
        assert_eq!(info.ty.id(), spec.ty_id);
        assert_eq!(info.offset, at);
        assert_eq!(info.nbytes, spec.data.len() as u64, "{}", spec.name);
        assert_eq!(info.offset % 32, 0);
        let t = f.tensor(&spec.name).expect("present");
        assert_eq!(t.data, &spec.data[..], "{}", spec.name);
        let data_at = t.data.as_ptr() as usize - f.bytes().as_ptr() as usize;
        assert_eq!(data_at as u64, at, "the slice is inside the file's bytes");
    }
    // The last tensor ends at the end of the file, so every shorter prefix fails.
    let last = f.tensors().last().expect("tensors");
    assert_eq!(last.offset + last.nbytes, f.file_len());

    let q41 = f.tensor("q41.weight").expect("q41");
    assert_eq!((q41.info.n_elements(), q41.info.rows()), (96, 3));
    assert_eq!(q41.info.ty, GgmlType::Q4_1);
    assert!(q41.expect_shape(&[32, 1, 1, 3]).is_ok());
    assert_eq!(q41.row_bytes(), 20);
    let q41_data = &b.tensors[4].data;
    for i in 0..3 {
        assert_eq!(
            q41.row(i).ok(),
            q41_data.get(i as usize * 20..(i as usize + 1) * 20)
        );
    }
    assert!(matches!(q41.row(3), Err(EngineError::InvalidArgument(m)) if m.contains("row 3 of 3")));
    assert!(matches!(
        q41.row(u64::MAX),
        Err(EngineError::InvalidArgument(_))
    ));
    let shape = q41.expect_shape(&[32, 3]);
    assert!(
        matches!(&shape, Err(EngineError::Model(m)) if m.contains("q41.weight")),
        "{shape:?}"
    );
    assert!(matches!(q41.to_f32(), Err(EngineError::Unsupported(m)) if m.contains("q41.weight")));

    assert_eq!(
        f.tensor("norm.weight").and_then(|t| t.to_f32()).ok(),
        Some(NORM.to_vec())
    );
    let half = f
        .tensor("half.weight")
        .and_then(|t| t.to_f32())
        .expect("f16");
    assert_eq!(
        half,
        vec![
            1.0,
            -2.0,
            0.333_251_95,
            5.960_464_5e-8,
            65504.0,
            0.0,
            -0.0,
            3.0
        ]
    );
    let bf = f
        .tensor("bf.weight")
        .and_then(|t| t.to_f32())
        .expect("bf16");
    assert_eq!(bf, vec![1.0, -3.5, 0.15625, 256.0]);

    assert!(f.get_tensor("nope").is_none());
    match f.tensor("nope") {
        Err(EngineError::Model(m)) => assert_eq!(m, "tensor \"nope\": missing"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn version_2_and_a_larger_alignment_parse() {
    let mut b = small_valid().kv("general.alignment", Value::U32(64));
    b.version = 2;
    let built = b.build();
    let h = parse_header(&built.bytes).expect("valid");
    assert_eq!((h.version, h.alignment), (2, 64));
    assert_eq!(h.data_offset % 64, 0);
    assert!(h.tensors.iter().all(|t| t.offset % 64 == 0));
    assert_eq!(
        h.tensors.iter().map(|t| t.offset).collect::<Vec<_>>(),
        built.placed
    );
}

#[test]
fn a_file_without_tensors_parses() {
    let b = GgufBuilder::default().kv("general.architecture", Value::String("a".into()));
    let f = GgufFile::from_bytes(b.build().bytes).expect("valid");
    assert!(f.tensors().is_empty());
    assert_eq!(f.architecture().ok(), Some("a"));
    let none = GgufFile::from_bytes(GgufBuilder::default().build().bytes).expect("valid");
    assert!(matches!(none.architecture(), Err(EngineError::Model(_))));
}

#[test]
fn every_truncation_is_a_format_error() {
    let bytes = small_valid().build().bytes;
    assert!(parse_header(&bytes).is_ok());
    for n in 0..bytes.len() {
        let prefix = bytes.get(..n).expect("prefix");
        match parse_header(prefix) {
            Err(EngineError::Format(m)) => assert!(!m.is_empty()),
            other => panic!("prefix of {n} of {} bytes: {other:?}", bytes.len()),
        }
    }
    println!("{} truncations refused", bytes.len());
}

#[test]
fn bad_magic_and_versions() {
    let mut b = small_valid();
    b.magic = *b"GGML";
    assert!(refuse_format(&b).contains("magic at offset 0"));
    for v in [0u32, 1, 4, 0x0300_0000, 0x0200_0000, u32::MAX] {
        let mut b = small_valid();
        b.version = v;
        let m = unsupported_msg(parse_header(&b.build().bytes));
        assert!(m.contains("version"), "{m}");
        if v.swap_bytes() == 3 || v.swap_bytes() == 2 {
            assert!(m.contains("big-endian"), "{m}");
        }
    }
}

fn patch_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn huge_counts_are_refused_before_allocating() {
    for huge in [u64::MAX, 1 << 40, 1 << 20] {
        let mut bytes = small_valid().build().bytes;
        patch_u64(&mut bytes, 16, huge);
        let m = format_msg(parse_header(&bytes));
        assert!(m.contains("metadata count at offset 16"), "{m}");
        let mut bytes = small_valid().build().bytes;
        patch_u64(&mut bytes, 8, huge);
        let m = format_msg(parse_header(&bytes));
        assert!(m.contains("tensor count"), "{m}");
    }
    // An array claiming 2^62 u32 elements, and one of strings.
    for elem in [4u32, 8] {
        let mut p = elem.to_le_bytes().to_vec();
        p.extend_from_slice(&(1u64 << 62).to_le_bytes());
        p.extend_from_slice(&[0; 64]);
        let m = refuse_format(&small_valid().raw_kv("bad.array", 9, p));
        assert!(m.contains("\"bad.array\" array length"), "{m}");
    }
    let mut p = u64::MAX.to_le_bytes().to_vec();
    p.extend_from_slice(b"abc");
    let m = refuse_format(&small_valid().raw_kv("bad.string", 8, p));
    assert!(
        m.contains("\"bad.string\"") && m.contains("string length"),
        "{m}"
    );
    // A huge key length.
    let mut bytes = GgufBuilder::default().kv("k", Value::U8(1)).build().bytes;
    patch_u64(&mut bytes, 24, u64::MAX - 1);
    assert!(format_msg(parse_header(&bytes)).contains("metadata key 0"));
}

#[test]
fn bad_strings_value_types_and_depth() {
    let mut p = 3u64.to_le_bytes().to_vec();
    p.extend_from_slice(&[b'a', 0xc3, 0x28]);
    let m = refuse_format(&small_valid().raw_kv("bad.utf8", 8, p));
    assert!(m.contains("\"bad.utf8\"") && m.contains("not UTF-8"), "{m}");
    let m = refuse_format(&small_valid().raw_kv("bad.type", 13, vec![0; 8]));
    assert!(
        m.contains("\"bad.type\"") && m.contains("unknown value type 13"),
        "{m}"
    );
    let mut p = 77u32.to_le_bytes().to_vec();
    p.extend_from_slice(&1u64.to_le_bytes());
    let m = refuse_format(&small_valid().raw_kv("bad.elem", 9, p));
    assert!(m.contains("unknown value type 77"), "{m}");
    // Arrays nested one deeper than allowed.
    let mut v = Value::U8(1);
    for _ in 0..=MAX_ARRAY_DEPTH {
        v = Value::Array(vec![v]);
    }
    let m = refuse_format(&small_valid().kv("deep", v));
    assert!(m.contains("nested"), "{m}");
    let m = refuse_format(&small_valid().raw_kv("bad.bool", 7, vec![2]));
    assert!(m.contains("bool"), "{m}");
    let m = refuse_format(&small_valid().kv("t.u8", Value::U8(0)));
    assert!(m.contains("duplicate key"), "{m}");
}

#[test]
fn bad_tensor_infos() {
    let m = unsupported_msg(parse_header(
        &with_tensor(TensorSpec::new("odd.weight", &[32], 99, vec![0; 32]))
            .build()
            .bytes,
    ));
    assert!(m.contains("odd.weight") && m.contains("99"), "{m}");
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "five",
        &[1, 1, 1, 1, 1],
        ty::F32,
        vec![0; 4],
    )));
    assert!(m.contains("\"five\"") && m.contains("n_dims 5"), "{m}");
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "nodims",
        &[],
        ty::F32,
        vec![0; 4],
    )));
    assert!(m.contains("n_dims 0"), "{m}");
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "zero",
        &[4, 0],
        ty::F32,
        vec![],
    )));
    assert!(
        m.contains("\"zero\"") && m.contains("dimension 1 is 0"),
        "{m}"
    );
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "big",
        &[1 << 32, 1 << 32, 2],
        ty::F32,
        vec![],
    )));
    assert!(m.contains("\"big\"") && m.contains("overflow"), "{m}");
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "bytes",
        &[1 << 62, 2],
        ty::F32,
        vec![],
    )));
    assert!(m.contains("\"bytes\"") && m.contains("overflow"), "{m}");
    let m = refuse_format(&with_tensor(TensorSpec::new(
        "partial",
        &[33],
        ty::Q8_0,
        vec![0; 34],
    )));
    assert!(
        m.contains("\"partial\"") && m.contains("multiple of 32"),
        "{m}"
    );
}

#[test]
fn bad_tensor_placement() {
    let mut t = TensorSpec::new("far.weight", &[4], ty::F32, f32_bytes(&[2.0; 4]));
    t.offset = Some(1 << 40);
    let m = refuse_format(&with_tensor(t.clone()));
    assert!(
        m.contains("\"far.weight\"") && m.contains("past the end"),
        "{m}"
    );
    t.offset = Some(u64::MAX - 31);
    assert!(refuse_format(&with_tensor(t.clone())).contains("far.weight"));
    t.offset = Some(36);
    let m = refuse_format(&with_tensor(t.clone()));
    assert!(
        m.contains("\"far.weight\"") && m.contains("not a multiple of the alignment 32"),
        "{m}"
    );
    t.offset = Some(0);
    let m = refuse_format(&with_tensor(t));
    assert!(m.contains("overlap"), "{m}");

    // The last tensor ends one byte past the end of the file.
    let mut bytes = small_valid().build().bytes;
    bytes.pop();
    let m = format_msg(parse_header(&bytes));
    assert!(
        m.contains("\"q4k.weight\"") && m.contains("past the end"),
        "{m}"
    );

    let b = with_tensor(TensorSpec::new(
        "ok.weight",
        &[4],
        ty::F32,
        f32_bytes(&[3.0; 4]),
    ));
    assert!(refuse_format(&b).contains("duplicate tensor name"));
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, u32::MAX] {
        let m = refuse_format(&small_valid().kv("general.alignment", Value::U32(a)));
        assert!(
            m.contains("general.alignment") && m.contains("power of two"),
            "{a}: {m}"
        );
    }
    for v in [Value::U64(32), Value::I32(32), Value::String("32".into())] {
        let m = refuse_format(&small_valid().kv("general.alignment", v));
        assert!(
            m.contains("general.alignment") && m.contains("expected a u32"),
            "{m}"
        );
    }
}

#[test]
fn a_file_that_is_only_the_header() {
    let built = small_valid().build();
    // Magic, version and counts only.
    let m = format_msg(parse_header(&built.bytes[..24]));
    assert!(m.contains("metadata count at offset 16"), "{m}");
    // Everything up to the data section, which is missing.
    let m = format_msg(parse_header(&built.bytes[..built.data_offset as usize]));
    assert!(m.contains("past the end"), "{m}");
    let m = format_msg(parse_header(b"GGUF"));
    assert!(m.contains("GGUF version at offset 4"), "{m}");
    assert!(format_msg(parse_header(&[])).contains("magic"));
}

#[test]
fn open_reads_a_file_and_names_it_in_errors() {
    let dir = std::env::temp_dir().join(format!("okv_gguf_open_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.gguf");
    let built = small_valid().build();
    std::fs::write(&good, &built.bytes).expect("write");
    let f = GgufFile::open(&good).expect("open");
    assert_eq!(f.bytes(), &built.bytes[..]);
    assert_eq!(
        f.tensor("norm.weight").and_then(|t| t.to_f32()).ok(),
        Some(NORM.to_vec())
    );

    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, &built.bytes[..100]).expect("write");
    let m = format_msg(GgufFile::open(&bad));
    assert!(m.contains("bad.gguf"), "{m}");
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(format_msg(GgufFile::open(&empty)).contains("magic"));
    match GgufFile::open(dir.join("absent.gguf")) {
        Err(EngineError::Io(m)) => assert!(m.contains("absent.gguf"), "{m}"),
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}
