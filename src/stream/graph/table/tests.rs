//! The check of a captured upload node, without a device.

use super::*;

fn upload(table: u64, bytes: usize) -> sys::CUDA_MEMCPY3D {
    let mut p = sys::CUDA_MEMCPY3D::zeroed();
    p.srcMemoryType = sys::CU_MEMORYTYPE_HOST;
    p.dstMemoryType = sys::CU_MEMORYTYPE_DEVICE;
    p.dstDevice = table;
    p.WidthInBytes = bytes;
    p.Height = 1;
    p.Depth = 1;
    p
}

#[test]
fn only_the_one_dimensional_copy_into_the_table_is_taken_as_its_upload() {
    let (table, bytes) = (0x7000_0000_0000, 64);
    assert!(check_upload(&upload(table, bytes), table, bytes).is_ok());
    let mut unified = upload(table, bytes);
    unified.dstMemoryType = sys::CU_MEMORYTYPE_UNIFIED;
    assert!(check_upload(&unified, table, bytes).is_ok());
    let refused = |p: &sys::CUDA_MEMCPY3D| {
        matches!(
            check_upload(p, table, bytes),
            Err(Error::InvalidArgument { .. })
        )
    };
    assert!(refused(&upload(table + 8, bytes)), "another destination");
    assert!(refused(&upload(table, bytes - 8)), "another size");
    let mut p = upload(table, bytes);
    p.Height = 2;
    assert!(refused(&p), "two rows");
    let mut p = upload(table, bytes);
    p.dstXInBytes = 8;
    assert!(refused(&p), "an offset into the table");
    let mut p = upload(table, bytes);
    p.dstMemoryType = sys::CU_MEMORYTYPE_HOST;
    assert!(refused(&p), "into host memory");
}
