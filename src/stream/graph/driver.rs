//! The driver calls of a capture: its id, its last node, its end, and the graph's destruction.

use core::ptr;

use crate::error::{DriverResult, Error, check};
use crate::sys;

use super::super::Stream;

/// Ends the capture on its stream and destroys its graph when dropped: while a panic of the
/// capturing closure unwinds.
pub(super) struct EndOnUnwind<'s>(pub(super) &'s Stream);

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if let Ok(graph) = end_capture(self.0) {
            destroy_graph(graph);
        }
    }
}

/// `cuStreamGetCaptureInfo` — the id of the capture under way on `stream` (its context current).
pub(super) fn capture_id(stream: &Stream) -> Result<u64, Error> {
    let (mut status, mut id) = (0u32, 0u64);
    // SAFETY: a live stream of the current context; `status` and `id` are written, the optional
    // outputs are null.
    check(unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.as_raw(),
            &raw mut status,
            &raw mut id,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    })?;
    if status == sys::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        Ok(id)
    } else {
        Err(Error::StreamCapturing {
            what: "the capture was invalidated by a call it refused",
        })
    }
}

/// The node the capture on `stream` added last: the one node the stream's next work depends on.
pub(super) fn last_node(stream: &Stream) -> Result<sys::CUgraphNode, Error> {
    let mut status = 0u32;
    let mut nodes: *const sys::CUgraphNode = ptr::null();
    let mut count = 0usize;
    // SAFETY: a live stream of the current context (the operation just bound it); `nodes` is set to
    // the driver's array of `count` nodes, read below before any other call on the stream.
    check(unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.as_raw(),
            &raw mut status,
            ptr::null_mut(),
            ptr::null_mut(),
            &raw mut nodes,
            &raw mut count,
        )
    })?;
    if status != sys::CU_STREAM_CAPTURE_STATUS_ACTIVE || count != 1 || nodes.is_null() {
        return Err(Error::StreamCapturing {
            what: "the capture's last node is not one kernel launch",
        });
    }
    // SAFETY: `nodes` points at `count` (one) nodes, valid until the next call on the stream.
    Ok(unsafe { *nodes })
}

/// `cuStreamEndCapture` of the capture under way on `stream`: its graph.
pub(super) fn end_capture(stream: &Stream) -> DriverResult<sys::CUgraph> {
    let mut graph: sys::CUgraph = ptr::null_mut();
    // SAFETY: a live stream of the current context, capturing (begun by `Graph::capture`); `graph`
    // is written.
    let ended = check(unsafe { sys::cuStreamEndCapture(stream.as_raw(), &raw mut graph) });
    if let Err(error) = ended {
        // An invalidated capture may still hand back a graph to destroy.
        destroy_graph(graph);
        return Err(error);
    }
    Ok(graph)
}

/// `cuGraphDestroy`, of a graph owned by the caller (null: nothing).
pub(super) fn destroy_graph(graph: sys::CUgraph) {
    if !graph.is_null() {
        // SAFETY: a graph this module made and owns, destroyed once; its instantiation (if any) was
        // destroyed before or never made. The error is ignored: a graph the driver refuses to
        // destroy is leaked, which touches no memory.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}
