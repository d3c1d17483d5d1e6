//! The loader over the two real models (paths from tests/common): tensor
//! counts, architectures, known tensors' types and shapes, every tensor's
//! data inside the file, and an F32 norm read as finite values.

mod common;

use offgraph_kv_engine::gguf::GgufFile;
use offgraph_kv_engine::GgmlType;

fn check_all_tensors_inside(f: &GgufFile) {
    let base = f.bytes().as_ptr() as usize;
    for info in f.tensors() {
        let t = f
            .tensor(&info.name)
            .expect("every listed tensor is readable");
        assert_eq!(t.data.len() as u64, info.nbytes, "{}", info.name);
        let at = t.data.as_ptr() as usize - base;
        assert_eq!(at as u64, info.offset, "{}", info.name);
        assert!(info.offset + info.nbytes <= f.file_len(), "{}", info.name);
        assert_eq!(info.offset % f.header().alignment, 0, "{}", info.name);
        assert_eq!(
            info.nbytes,
            info.ty.row_bytes(info.dims[0]).expect("row") * info.rows()
        );
    }
}

#[test]
fn gemma3_opens_with_its_tensor_table() {
    let f = GgufFile::open(common::gemma3_gguf()).expect("gemma3 opens");
    assert_eq!(f.architecture().ok(), Some("gemma3"));
    assert_eq!(f.tensors().len(), 236);
    let emb = f.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(emb.info.ty, GgmlType::Q8_0);
    emb.expect_shape(&[640, 262144]).expect("shape");
    let norm = f.tensor("output_norm.weight").expect("output_norm");
    assert_eq!(norm.info.ty, GgmlType::F32);
    let v = norm.to_f32().expect("f32");
    assert_eq!(v.len(), 640);
    assert!(v.iter().all(|x| x.is_finite()));
    assert!(v.iter().any(|&x| x != 0.0));
    check_all_tensors_inside(&f);
    // Offsets as the gguf Python package's reader reports them.
    assert_eq!(f.header().data_offset, 6_525_120);
    assert_eq!((norm.info.offset, norm.info.nbytes), (6_525_120, 2560));
    assert_eq!((emb.info.offset, emb.info.nbytes), (6_527_680, 178_257_920));
    let ffn = f.tensor("blk.0.ffn_down.weight").expect("ffn_down");
    assert_eq!(ffn.info.ty, GgmlType::Q6_K);
    assert_eq!(ffn.info.dims, [2048, 640]);
    assert_eq!((ffn.info.offset, ffn.info.nbytes), (185_896_128, 1_075_200));
    let tokens = f.metadata().array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.len(), 262144);
    println!(
        "gemma3: {} tensors, {} metadata keys, version {}, data at {}",
        f.tensors().len(),
        f.metadata().entries.len(),
        f.version(),
        f.header().data_offset
    );
}

#[test]
fn smollm2_opens_with_its_tensor_table() {
    let f = GgufFile::open(common::smollm2_gguf()).expect("smollm2 opens");
    assert_eq!(f.architecture().ok(), Some("llama"));
    assert_eq!(f.tensors().len(), 272);
    let down = f.tensor("blk.0.ffn_down.weight").expect("ffn_down");
    assert_eq!(down.info.ty, GgmlType::Q4_1);
    down.expect_shape(&[1536, 576]).expect("shape");
    assert_eq!(down.info.rows(), 576);
    assert!(down.expect_shape(&[576, 1536]).is_err());
    check_all_tensors_inside(&f);
    // Offsets as the gguf Python package's reader reports them.
    assert_eq!(f.header().data_offset, 1_785_664);
    assert_eq!((down.info.offset, down.info.nbytes), (31_868_992, 552_960));
    let norm = f.tensor("output_norm.weight").expect("output_norm");
    assert_eq!((norm.info.offset, norm.info.nbytes), (98_360_128, 2304));
    assert_eq!(norm.info.offset + norm.info.nbytes, f.file_len());
    println!(
        "smollm2: {} tensors, {} metadata keys, version {}",
        f.tensors().len(),
        f.metadata().entries.len(),
        f.version()
    );
}
