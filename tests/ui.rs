//! Compile-fail cases: the driver's ordering rules that the type system enforces (`ui-tests/README.md`).
//!
//! Needs no GPU and no libcuda at run time: a suite of compile-fail cases only is built with
//! `cargo check`, so nothing is linked or run. Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite ./with-libcuda cargo test --features nccl --test ui` (`nccl` turns on `cudarc`)
//! and review the diff.
//!
//! Every folder of `ui-tests/` is an area of cases, run with the default features, except
//! `ui-tests/cudarc/` and `ui-tests/nccl/`: their cases use the types of the feature of their name,
//! so they run only where that feature is on (`cargo test --features cudarc`, `--features nccl`),
//! and are not compiled without it.

/// The areas that need a cargo feature, and whether it is on.
const FEATURE_AREAS: &[(&str, bool)] = &[
    ("cudarc", cfg!(feature = "cudarc")),
    ("nccl", cfg!(feature = "nccl")),
];

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    let mut areas: Vec<String> = std::fs::read_dir("ui-tests")
        .expect("ui-tests/ is readable")
        .map(|entry| entry.expect("ui-tests/ lists its entries"))
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| {
            entry
                .file_name()
                .into_string()
                .expect("area names are UTF-8")
        })
        .collect();
    areas.sort();
    for area in &areas {
        let enabled = FEATURE_AREAS
            .iter()
            .find(|(name, _)| name == area)
            .is_none_or(|&(_, on)| on);
        if enabled {
            t.compile_fail(format!("ui-tests/{area}/*.rs"));
        }
    }
}
