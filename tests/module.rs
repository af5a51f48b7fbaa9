//! Loading device code and looking up kernels against a real driver. Every test skips visibly without a
//! GPU.

mod common;

use core::ffi::c_void;
use core::ptr;

use common::gpu_or_skip;
use cuda_vmm::{DriverError, Module};

// The driver's own symbols with integer results, to set and read the current context directly.
unsafe extern "C" {
    fn cuCtxSetCurrent(ctx: *mut c_void) -> u32;
    fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> u32;
}

/// Raw `cuCtxSetCurrent(NULL)`: no context is current on this thread afterwards.
fn unbind() {
    // SAFETY: a null context is the documented way to unbind; nothing else is passed.
    let code = unsafe { cuCtxSetCurrent(ptr::null_mut()) };
    assert_eq!(
        code,
        0,
        "cuCtxSetCurrent(NULL): {}",
        common::code_name(code)
    );
}

/// Raw `cuCtxGetCurrent`: the context current on this thread (null for none).
fn current() -> *mut c_void {
    let mut ctx: *mut c_void = ptr::null_mut();
    // SAFETY: `ctx` is writable for the call.
    let code = unsafe { cuCtxGetCurrent(&raw mut ctx) };
    assert_eq!(code, 0, "cuCtxGetCurrent: {}", common::code_name(code));
    ctx
}

#[test]
fn function_binds_the_module_context() {
    let Some((_device, ctx)) = gpu_or_skip("function_binds_the_module_context") else {
        return;
    };
    let module = Module::load_ptx(&ctx, &common::add_one_ptx()).unwrap();

    // With no context current, the lookup binds the module's context itself.
    unbind();
    assert!(current().is_null(), "nothing is current after unbinding");
    module.function(c"add_one").unwrap();
    assert_eq!(
        current(),
        ctx.as_raw().cast::<c_void>(),
        "`function` made the module's context current"
    );

    unbind();
    assert_eq!(
        module.function(c"no_such_kernel").unwrap_err(),
        DriverError::NOT_FOUND
    );
    assert_eq!(current(), ctx.as_raw().cast::<c_void>());
}
