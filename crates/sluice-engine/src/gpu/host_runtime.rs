//! [`HostRuntime`]: the GPU path's interface on plain host memory, where there is no CUDA.

use std::ptr;

use super::runtime::{CopyKind, EventHandle, GpuError, GpuRuntime, HostFn, StreamHandle};

/// Every "device" address is a host address and every stream runs at once: a copy is a
/// `memcpy` done before `copy_async` returns, an event is complete when recorded, a host
/// function runs on the caller's thread. The pool on it is not pinned. This is what the GPU
/// path runs on when a machine has no CUDA runtime, so that the same code moves the bytes.
#[derive(Debug, Default)]
pub struct HostRuntime;

impl GpuRuntime for HostRuntime {
    fn describe(&self) -> String {
        "host memory (no CUDA runtime)".into()
    }

    fn pins_memory(&self) -> bool {
        false
    }

    unsafe fn host_register(&self, _ptr: *mut u8, _len: usize) -> Result<(), GpuError> {
        Ok(())
    }

    unsafe fn host_unregister(&self, _ptr: *mut u8) -> Result<(), GpuError> {
        Ok(())
    }

    unsafe fn copy_async(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        _kind: CopyKind,
        _stream: StreamHandle,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's contract (both ranges valid for `len` bytes); they may overlap
        // only if the caller passed the same memory twice, which `ptr::copy` allows.
        unsafe { ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    fn event_create(&self) -> Result<EventHandle, GpuError> {
        Ok(EventHandle(0))
    }

    fn event_destroy(&self, _event: EventHandle) {}

    fn event_record(&self, _event: EventHandle, _stream: StreamHandle) -> Result<(), GpuError> {
        Ok(())
    }

    fn event_query(&self, _event: EventHandle) -> Result<bool, GpuError> {
        Ok(true)
    }

    fn event_synchronize(&self, _event: EventHandle) -> Result<(), GpuError> {
        Ok(())
    }

    fn stream_synchronize(&self, _stream: StreamHandle) -> Result<(), GpuError> {
        Ok(())
    }

    fn stream_wait_event(&self, _s: StreamHandle, _e: EventHandle) -> Result<(), GpuError> {
        Ok(())
    }

    fn launch_host_func(&self, _stream: StreamHandle, f: HostFn) -> Result<(), GpuError> {
        f();
        Ok(())
    }
}
