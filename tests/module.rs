//! Loading device code and looking up kernels against a real driver. Every test skips visibly without a
//! GPU.

mod common;

use core::ffi::{CStr, c_void};
use core::ptr;

use common::{gpu_or_skip, pattern};
use cuda_vmm::{DeviceBuffer, DriverError, Error, Module};

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
        Error::Driver(DriverError::NOT_FOUND)
    );
    assert_eq!(current(), ctx.as_raw().cast::<c_void>());
}

#[test]
fn binary_images_are_refused_before_the_driver() {
    let Some((_device, ctx)) = gpu_or_skip("binary_images_are_refused_before_the_driver") else {
        return;
    };
    // The first is the input that crashed an H200 process (SIGSEGV) when it reached the driver: a
    // fatbin magic and version, after which the driver read a header that was not there. Then a cubin's
    // ELF magic and a fatbin wrapper's magic. Each is refused at its first byte that is not text.
    let images: [(&[u8], usize, u8); 3] = [
        (b"\x50\xed\x55\xba\x01\0", 1, 0xed),
        (b"\x7fELF\x02\x01\x01\0", 0, 0x7f),
        (b"\xb1\x43\x62\x46\x01\0", 0, 0xb1),
    ];
    for (image, offset, byte) in images {
        let image = CStr::from_bytes_with_nul(image).unwrap();
        // `load_ptx` binds its context before its first driver call: with nothing current before, and
        // still nothing after, the refusal came before any driver call.
        unbind();
        let e = Module::load_ptx(&ctx, image).unwrap_err();
        println!("{:02x?}: {e}", image.to_bytes());
        assert_eq!(e, Error::NotPtxText { offset, byte });
        assert!(current().is_null(), "the driver was not called");
    }

    // Text shorter than 16 bytes reaches the driver NUL-padded to 16 bytes, and gets its answer: a
    // refusal for text that is not PTX (what the driver makes of empty text is only printed).
    match Module::load_ptx(&ctx, c"") {
        Ok(_) => println!("empty text: loaded"),
        Err(Error::Driver(e)) => println!("empty text: {e}"),
        Err(e) => panic!("empty text: {e}"),
    }
    let e = Module::load_ptx(&ctx, c"x").unwrap_err();
    println!("\"x\": {e}");
    assert!(matches!(e, Error::Driver(_)), "{e}");

    // The process and the context keep working: the example kernel loads and runs.
    let input = pattern(1000, 5);
    let src = DeviceBuffer::from_host(&ctx, &input).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&ctx, input.len()).unwrap();
    let (src_view, dst_view) = (src.as_slice(), dst.as_mut_slice());
    // SAFETY: both views are `ctx`'s own buffers of `input.len()` u32s, borrowed across the call, and
    // nothing else uses them meanwhile.
    unsafe {
        common::add_one(
            &ctx,
            dst_view.as_raw_ptr(),
            src_view.as_raw_ptr(),
            input.len(),
        )
    }
    .unwrap();
    let expected: Vec<u32> = input.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(dst.as_slice().to_vec().unwrap(), expected);
}

#[test]
fn load_image_takes_what_load_ptx_takes() {
    let Some((_device, ctx)) = gpu_or_skip("load_image_takes_what_load_ptx_takes") else {
        return;
    };
    let ptx = common::add_one_ptx();
    // SAFETY: `ptx` is whole NUL-terminated PTX text (far longer than 16 bytes), alive and unchanged
    // for the call.
    let module = unsafe { Module::load_image(&ctx, ptx.as_ptr().cast::<c_void>()) }.unwrap();
    module.function(c"add_one").unwrap();
    assert_eq!(module.device(), ctx.device());
}
