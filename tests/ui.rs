//! Compile-fail cases: the driver's ordering rules that the type system enforces (`ui-tests/README.md`).
//!
//! Needs no GPU and no libcuda at run time: a suite of compile-fail cases only is built with
//! `cargo check`, so nothing is linked or run. Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite ./with-libcuda cargo test --test ui` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/*/*.rs");
}
