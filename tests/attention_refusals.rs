//! attend() refuses inconsistent inputs with typed errors naming what it expected.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use offgraph_kv::attention::{attend, attend_into, AttendOptions, Backend, NativeIsa};
use offgraph_kv::{AttendSpec, CacheError, KeyLayout, KvRows, MaskKind, Run, Runs};

const HD: usize = 8;
const SLOTS: usize = 16;

fn pools() -> (Vec<f32>, Vec<f32>) {
    (vec![0.5; 2 * SLOTS * HD], vec![0.25; 2 * SLOTS * HD])
}

fn spec<'a>(k: &'a [f32], v: &'a [f32], positions: &'a [usize], read: Runs) -> AttendSpec<'a> {
    AttendSpec {
        k: KvRows::from_f32(k),
        v: KvRows::from_f32(v),
        n_kv_heads: 2,
        head_dim: HD,
        slots: SLOTS,
        positions,
        keys: KeyLayout::Runs {
            read,
            read_base_pos: 0,
            mask: MaskKind::Causal,
        },
    }
}

fn all_backends() -> Vec<AttendOptions> {
    [Backend::Auto, Backend::Native, Backend::Xnnpack]
        .into_iter()
        .filter(|b| b.available())
        .map(|backend| AttendOptions {
            backend,
            ..Default::default()
        })
        .collect()
}

#[track_caller]
fn shape_err(r: Result<Vec<f32>, CacheError>, needle: &str) {
    match r {
        Err(CacheError::Shape(m)) => assert!(m.contains(needle), "message {m:?} lacks {needle:?}"),
        other => panic!("expected Shape error mentioning {needle:?}, got {other:?}"),
    }
}

#[track_caller]
fn arg_err(r: Result<Vec<f32>, CacheError>, needle: &str) {
    match r {
        Err(CacheError::InvalidArgument(m)) => {
            assert!(m.contains(needle), "message {m:?} lacks {needle:?}")
        }
        other => panic!("expected InvalidArgument mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn wrong_q_length_or_shape() {
    let (k, v) = pools();
    let pos = [3usize];
    let s = spec(&k, &v, &pos, Runs::one(Run::new(0, 4)));
    for o in all_backends() {
        shape_err(
            attend(&[0.0; 4 * HD - 1], [4, 1, HD], &s, &o),
            "expected 32 floats",
        );
        shape_err(
            attend(&[0.0; 4 * 2 * HD], [4, 2, HD], &s, &o),
            "q tokens: expected 1",
        );
        shape_err(
            attend(&[0.0; 4 * 16], [4, 1, 16], &s, &o),
            "q head_dim: expected 8",
        );
        shape_err(
            attend(&[0.0; 3 * HD], [3, 1, HD], &s, &o),
            "multiple of n_kv_heads = 2",
        );
        shape_err(
            attend(&[], [0, 1, HD], &s, &o),
            "multiple of n_kv_heads = 2",
        );
        let mut out = vec![0.0; 4 * HD + 1];
        match attend_into(&[0.0; 4 * HD], [4, 1, HD], &s, &o, &mut out) {
            Err(CacheError::Shape(m)) => assert!(m.contains("out: expected 32")),
            other => panic!("{other:?}"),
        }
        assert!(out.iter().all(|x| *x == 0.0), "a refused call wrote to out");
    }
}

#[test]
fn pool_length_mismatch() {
    let (k, v) = pools();
    let pos = [3usize];
    let s = spec(&k[..k.len() - 1], &v, &pos, Runs::one(Run::new(0, 4)));
    shape_err(
        attend(&[0.0; 4 * HD], [4, 1, HD], &s, &AttendOptions::default()),
        "spec.k: expected",
    );
    let s = spec(&k, &v[1..], &pos, Runs::one(Run::new(0, 4)));
    shape_err(
        attend(&[0.0; 4 * HD], [4, 1, HD], &s, &AttendOptions::default()),
        "spec.v: expected",
    );
}

#[test]
fn runs_out_of_bounds() {
    let (k, v) = pools();
    let pos = [20usize];
    for read in [
        Runs::one(Run::new(10, 7)),
        Runs::two(Run::new(12, 4), Run::new(15, 2)),
        Runs::one(Run::new(usize::MAX, 2)),
    ] {
        let s = spec(&k, &v, &pos, read);
        for o in all_backends() {
            arg_err(
                attend(&[0.0; 4 * HD], [4, 1, HD], &s, &o),
                "expected inside [0, 16)",
            );
        }
    }
}

#[test]
fn cells_refusals() {
    let (k, v) = pools();
    let pos = [1usize, 2];
    // Token 1's runs overlap at cell 5 (runs may come in any cell order).
    let runs = [Run::new(0, 3), Run::new(5, 2), Run::new(4, 2)];
    let mk = |offsets: &'static [usize], runs: &'static [Run], read_len: usize| KeyLayout::Cells {
        offsets,
        runs,
        read_len,
    };
    let leak = |r: &[Run]| -> &'static [Run] { Box::leak(r.to_vec().into_boxed_slice()) };
    let cases: Vec<(KeyLayout<'static>, &str, bool)> = vec![
        (
            mk(&[0, 1], leak(&runs), 8),
            "offsets: expected T + 1 = 3",
            true,
        ),
        (mk(&[0, 2, 1], leak(&runs), 8), "non-decreasing", false),
        (
            mk(&[0, 1, 2], leak(&runs), 6),
            "expected inside [0, 6)",
            false,
        ),
        (
            mk(&[0, 1, 2], leak(&runs), 17),
            "read_len: expected <= slots = 16",
            false,
        ),
        (mk(&[0, 1, 3], leak(&runs), 8), "expected disjoint", false),
    ];
    for (keys, needle, is_shape) in cases {
        let s = AttendSpec {
            k: KvRows::from_f32(&k),
            v: KvRows::from_f32(&v),
            n_kv_heads: 2,
            head_dim: HD,
            slots: SLOTS,
            positions: &pos,
            keys,
        };
        let r = attend(
            &[0.0; 4 * 2 * HD],
            [4, 2, HD],
            &s,
            &AttendOptions::default(),
        );
        if is_shape {
            shape_err(r, needle);
        } else {
            arg_err(r, needle);
        }
    }
}

#[test]
fn options_refusals() {
    let (k, v) = pools();
    let pos = [3usize];
    let s = spec(&k, &v, &pos, Runs::one(Run::new(0, 4)));
    let q = [0.0; 4 * HD];
    let o = AttendOptions {
        threads: Some(0),
        ..Default::default()
    };
    arg_err(attend(&q, [4, 1, HD], &s, &o), "threads: expected >= 1");
    let o = AttendOptions {
        scale: Some(f32::NAN),
        ..Default::default()
    };
    arg_err(attend(&q, [4, 1, HD], &s, &o), "scale: expected a finite");
    match Backend::parse("torch") {
        Err(CacheError::InvalidArgument(m)) => {
            assert!(m.contains("\"auto\", \"native\", \"xnnpack\"") && m.contains("torch"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(Backend::parse("auto").unwrap(), Backend::Auto);
    assert_eq!(Backend::parse("native").unwrap(), Backend::Native);
    assert_eq!(Backend::parse("xnnpack").unwrap(), Backend::Xnnpack);
    for b in [Backend::Auto, Backend::Native, Backend::Xnnpack] {
        assert_eq!(Backend::parse(b.name()).unwrap(), b);
    }
    // A forced ISA the CPU lacks is a Backend error; Scalar always runs.
    let o = AttendOptions {
        native_isa: NativeIsa::Scalar,
        backend: Backend::Native,
        ..Default::default()
    };
    assert!(attend(&q, [4, 1, HD], &s, &o).is_ok());
    #[cfg(target_arch = "x86_64")]
    if !offgraph_kv::cpu::features().avx512f {
        let o = AttendOptions {
            native_isa: NativeIsa::Avx512,
            backend: Backend::Native,
            ..Default::default()
        };
        assert!(matches!(
            attend(&q, [4, 1, HD], &s, &o),
            Err(CacheError::Backend(_))
        ));
    }
}
