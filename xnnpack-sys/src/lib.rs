//! Hand-written FFI declarations for the parts of XNNPACK that `offgraph-kv` uses,
//! checked against `/usr/include/xnnpack.h` of Debian's `libxnnpack-dev`
//! (`0.0~git20220216.ae108ef`).
//!
//! Only the operator API (not the subgraph API) is declared: initialisation,
//! fully-connected and softmax in f32, run and delete. `pthreadpool_t` is kept
//! opaque; pass a null pointer to run an operator on the calling thread.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::os::raw::{c_int, c_void};

/// `enum xnn_status` (a C enum: `int`).
pub type xnn_status = c_int;
pub const xnn_status_success: xnn_status = 0;
pub const xnn_status_uninitialized: xnn_status = 1;
pub const xnn_status_invalid_parameter: xnn_status = 2;
pub const xnn_status_invalid_state: xnn_status = 3;
pub const xnn_status_unsupported_parameter: xnn_status = 4;
pub const xnn_status_unsupported_hardware: xnn_status = 5;
pub const xnn_status_out_of_memory: xnn_status = 6;

/// `XNN_EXTRA_BYTES`: XNNPACK may read (never write) this many bytes past the end
/// of any input tensor.
pub const XNN_EXTRA_BYTES: usize = 16;

/// `XNN_FLAG_TRANSPOSE_WEIGHTS`: the fully-connected kernel is `[input_channels,
/// output_channels]` instead of `[output_channels, input_channels]`.
pub const XNN_FLAG_TRANSPOSE_WEIGHTS: u32 = 0x0000_0001;

/// Opaque `struct xnn_operator`.
#[repr(C)]
pub struct xnn_operator {
    _private: [u8; 0],
}
/// `xnn_operator_t`.
pub type xnn_operator_t = *mut xnn_operator;

/// Opaque `struct pthreadpool`; a null pointer means "run on the calling thread".
#[repr(C)]
pub struct pthreadpool {
    _private: [u8; 0],
}
/// `pthreadpool_t`.
pub type pthreadpool_t = *mut pthreadpool;

/// `struct xnn_allocator`; pass a null pointer to `xnn_initialize` for the default.
#[repr(C)]
pub struct xnn_allocator {
    pub context: *mut c_void,
    pub allocate: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    pub reallocate: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void>,
    pub deallocate: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
    pub aligned_allocate: Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>,
    pub aligned_deallocate: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
}

extern "C" {
    /// `enum xnn_status xnn_initialize(const struct xnn_allocator* allocator);`
    pub fn xnn_initialize(allocator: *const xnn_allocator) -> xnn_status;

    /// `enum xnn_status xnn_deinitialize(void);`
    pub fn xnn_deinitialize() -> xnn_status;

    /// `enum xnn_status xnn_run_operator(xnn_operator_t op, pthreadpool_t threadpool);`
    pub fn xnn_run_operator(op: xnn_operator_t, threadpool: pthreadpool_t) -> xnn_status;

    /// `enum xnn_status xnn_delete_operator(xnn_operator_t op);`
    pub fn xnn_delete_operator(op: xnn_operator_t) -> xnn_status;

    /// ```c
    /// enum xnn_status xnn_create_fully_connected_nc_f32(
    ///   size_t input_channels, size_t output_channels,
    ///   size_t input_stride, size_t output_stride,
    ///   const float* kernel, const float* bias,
    ///   float output_min, float output_max,
    ///   uint32_t flags, xnn_operator_t* fully_connected_op_out);
    /// ```
    /// The kernel (and bias) are packed at creation; the caller's copy may be freed after.
    pub fn xnn_create_fully_connected_nc_f32(
        input_channels: usize,
        output_channels: usize,
        input_stride: usize,
        output_stride: usize,
        kernel: *const f32,
        bias: *const f32,
        output_min: f32,
        output_max: f32,
        flags: u32,
        fully_connected_op_out: *mut xnn_operator_t,
    ) -> xnn_status;

    /// ```c
    /// enum xnn_status xnn_setup_fully_connected_nc_f32(
    ///   xnn_operator_t fully_connected_op, size_t batch_size,
    ///   const float* input, float* output, pthreadpool_t threadpool);
    /// ```
    pub fn xnn_setup_fully_connected_nc_f32(
        fully_connected_op: xnn_operator_t,
        batch_size: usize,
        input: *const f32,
        output: *mut f32,
        threadpool: pthreadpool_t,
    ) -> xnn_status;

    /// ```c
    /// enum xnn_status xnn_create_softmax_nc_f32(
    ///   size_t channels, size_t input_stride, size_t output_stride,
    ///   uint32_t flags, xnn_operator_t* softmax_op_out);
    /// ```
    pub fn xnn_create_softmax_nc_f32(
        channels: usize,
        input_stride: usize,
        output_stride: usize,
        flags: u32,
        softmax_op_out: *mut xnn_operator_t,
    ) -> xnn_status;

    /// ```c
    /// enum xnn_status xnn_setup_softmax_nc_f32(
    ///   xnn_operator_t softmax_op, size_t batch_size,
    ///   const float* input, float* output, pthreadpool_t threadpool);
    /// ```
    pub fn xnn_setup_softmax_nc_f32(
        softmax_op: xnn_operator_t,
        batch_size: usize,
        input: *const f32,
        output: *mut f32,
        threadpool: pthreadpool_t,
    ) -> xnn_status;
}

/// The header's name for a status code, for error messages.
pub fn status_name(s: xnn_status) -> &'static str {
    match s {
        xnn_status_success => "xnn_status_success",
        xnn_status_uninitialized => "xnn_status_uninitialized",
        xnn_status_invalid_parameter => "xnn_status_invalid_parameter",
        xnn_status_invalid_state => "xnn_status_invalid_state",
        xnn_status_unsupported_parameter => "xnn_status_unsupported_parameter",
        xnn_status_unsupported_hardware => "xnn_status_unsupported_hardware",
        xnn_status_out_of_memory => "xnn_status_out_of_memory",
        _ => "unknown xnn_status",
    }
}
