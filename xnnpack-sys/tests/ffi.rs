//! Initialise XNNPACK and run real operators with checked results.
#![allow(clippy::indexing_slicing)]

use std::ptr;
use xnnpack_sys::*;

fn init() {
    // SAFETY: a null allocator selects XNNPACK's default; repeated calls are allowed.
    let s = unsafe { xnn_initialize(ptr::null()) };
    assert_eq!(s, xnn_status_success, "{}", status_name(s));
}

/// y = x · Wᵀ, with W given as [out, in] (default) and as [in, out] (TRANSPOSE_WEIGHTS).
fn fully_connected(flags: u32) {
    init();
    let (cin, cout, batch) = (5usize, 3usize, 4usize);
    let w: Vec<f32> = (0..cin * cout).map(|i| (i as f32) * 0.25 - 1.0).collect();
    // Weight (o, c): [out, in] layout at o*cin + c, [in, out] layout at c*cout + o.
    let wt = |o: usize, c: usize| {
        if flags & XNN_FLAG_TRANSPOSE_WEIGHTS != 0 {
            w[c * cout + o]
        } else {
            w[o * cin + c]
        }
    };
    let mut x: Vec<f32> = (0..batch * cin)
        .map(|i| ((i * 7) % 11) as f32 - 5.0)
        .collect();
    x.extend_from_slice(&[0.0; XNN_EXTRA_BYTES / 4]);
    let mut y = vec![0f32; batch * cout];
    let mut op: xnn_operator_t = ptr::null_mut();
    // SAFETY: kernel holds cin*cout floats, bias null is allowed, op is a valid out pointer.
    let s = unsafe {
        xnn_create_fully_connected_nc_f32(
            cin,
            cout,
            cin,
            cout,
            w.as_ptr(),
            ptr::null(),
            f32::NEG_INFINITY,
            f32::INFINITY,
            flags,
            &mut op,
        )
    };
    assert_eq!(s, xnn_status_success, "{}", status_name(s));
    // SAFETY: op is live; x has batch*cin floats plus XNN_EXTRA_BYTES; y has batch*cout.
    unsafe {
        let s = xnn_setup_fully_connected_nc_f32(
            op,
            batch,
            x.as_ptr(),
            y.as_mut_ptr(),
            ptr::null_mut(),
        );
        assert_eq!(s, xnn_status_success, "{}", status_name(s));
        let s = xnn_run_operator(op, ptr::null_mut());
        assert_eq!(s, xnn_status_success, "{}", status_name(s));
        assert_eq!(xnn_delete_operator(op), xnn_status_success);
    }
    for b in 0..batch {
        for o in 0..cout {
            let want: f32 = (0..cin).map(|c| x[b * cin + c] * wt(o, c)).sum();
            assert!(
                (y[b * cout + o] - want).abs() < 1e-5,
                "y[{b},{o}] = {} want {want}",
                y[b * cout + o]
            );
        }
    }
}

#[test]
fn fully_connected_out_in_weights() {
    fully_connected(0);
}

#[test]
fn fully_connected_transposed_weights() {
    fully_connected(XNN_FLAG_TRANSPOSE_WEIGHTS);
}

#[test]
fn softmax_rows_sum_to_one() {
    init();
    let (ch, batch) = (7usize, 3usize);
    let mut x: Vec<f32> = (0..ch * batch).map(|i| (i as f32).sin() * 3.0).collect();
    x.extend_from_slice(&[0.0; XNN_EXTRA_BYTES / 4]);
    let mut y = vec![0f32; ch * batch];
    let mut op: xnn_operator_t = ptr::null_mut();
    // SAFETY: valid out pointer; buffers sized as declared, input padded.
    unsafe {
        assert_eq!(
            xnn_create_softmax_nc_f32(ch, ch, ch, 0, &mut op),
            xnn_status_success
        );
        assert_eq!(
            xnn_setup_softmax_nc_f32(op, batch, x.as_ptr(), y.as_mut_ptr(), ptr::null_mut()),
            xnn_status_success
        );
        assert_eq!(xnn_run_operator(op, ptr::null_mut()), xnn_status_success);
        assert_eq!(xnn_delete_operator(op), xnn_status_success);
    }
    for b in 0..batch {
        let row = &x[b * ch..(b + 1) * ch];
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..ch {
            let want = (row[c] - m).exp() / z;
            assert!((y[b * ch + c] - want).abs() < 1e-6, "softmax[{b},{c}]");
        }
    }
}
