//! Interoperation with other CUDA libraries of the Rust ecosystem, each behind a cargo feature of its
//! name and off by default, so the core keeps its dependencies.
//!
//! - [`cudarc`](mod@cudarc) (feature `cudarc`): views lent to cudarc's streams, kernel launches and
//!   libraries (cuBLAS, ...) inside [`cudarc::scope`].
//! - `nccl` (feature `nccl`, which turns on `cudarc`): NCCL collectives on views lent in a cudarc
//!   scope on the communicator's stream, and buffers registered with a communicator.

#[cfg(feature = "cudarc")]
pub mod cudarc;

#[cfg(feature = "nccl")]
pub mod nccl;
