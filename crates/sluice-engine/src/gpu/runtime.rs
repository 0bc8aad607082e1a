//! [`GpuRuntime`]: the CUDA runtime calls the GPU data path makes, and their error.

/// A CUDA stream (`cudaStream_t`) as an address; `StreamHandle(0)` is the legacy default
/// stream. Sluice never creates or destroys the caller's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub usize);

/// A CUDA event (`cudaEvent_t`) created by a [`GpuRuntime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventHandle(pub usize);

/// The direction of a copy, as `cudaMemcpyKind` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    HostToDevice = 1,
    DeviceToHost = 2,
}

/// Work a stream runs on the host once everything queued before it has finished
/// (`cudaLaunchHostFunc`). It must not call CUDA and must not panic (a panic is caught and
/// logged).
pub type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// A GPU runtime call failed, or there is no runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    #[error("no usable CUDA runtime: {reason}")]
    NoRuntime { reason: String },
    #[error("{call} failed: CUDA error {code} ({message})")]
    Call {
        call: &'static str,
        code: i32,
        message: String,
    },
    #[error("allocating a {bytes}-byte pinned pool failed: {source}")]
    Alloc { bytes: u64, source: std::io::Error },
    #[error("{what}: {problem}")]
    Invalid { what: String, problem: String },
}

/// The CUDA runtime calls of the GPU data path. Addresses are plain integers: host
/// addresses where the call says host, device addresses (`tensor.data_ptr()`) where it
/// says device. Calls that queue work on a stream return once it is queued; the work runs in
/// the stream's order.
pub trait GpuRuntime: Send + Sync {
    /// Which runtime this is, for logs: a library path and version, or "host memory".
    fn describe(&self) -> String;

    /// Whether host memory registered through [`GpuRuntime::host_register`] is really
    /// page-locked for DMA (false for [`crate::gpu::HostRuntime`]).
    fn pins_memory(&self) -> bool;

    /// Page-locks `len` bytes at `ptr` for DMA (`cudaHostRegister`).
    ///
    /// # Safety
    /// `ptr..ptr+len` is mapped memory that stays mapped until
    /// [`GpuRuntime::host_unregister`].
    unsafe fn host_register(&self, ptr: *mut u8, len: usize) -> Result<(), GpuError>;

    /// Undoes [`GpuRuntime::host_register`] (`cudaHostUnregister`).
    ///
    /// # Safety
    /// `ptr` was registered and no queued copy still uses it.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<(), GpuError>;

    /// Queues a copy of `len` bytes from `src` to `dst` on `stream` (`cudaMemcpyAsync`).
    ///
    /// # Safety
    /// Both ranges stay valid, and the source unchanged, until the copy has run: until an
    /// event recorded after it on `stream` has completed.
    unsafe fn copy_async(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        kind: CopyKind,
        stream: StreamHandle,
    ) -> Result<(), GpuError>;

    /// A new event without timing (`cudaEventCreateWithFlags(cudaEventDisableTiming)`).
    fn event_create(&self) -> Result<EventHandle, GpuError>;
    /// Destroys an event this runtime created.
    fn event_destroy(&self, event: EventHandle);
    /// Marks the point in `stream` after everything queued so far (`cudaEventRecord`).
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<(), GpuError>;
    /// Whether the work before the event's last record has finished (`cudaEventQuery`).
    fn event_query(&self, event: EventHandle) -> Result<bool, GpuError>;
    /// Blocks the calling thread until the event has completed (`cudaEventSynchronize`).
    fn event_synchronize(&self, event: EventHandle) -> Result<(), GpuError>;
    /// Blocks the calling thread until `stream` has run everything queued on it.
    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), GpuError>;
    /// Makes later work on `stream` wait for `event` (`cudaStreamWaitEvent`); the host does
    /// not wait.
    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<(), GpuError>;
    /// Queues `f` to run on a host thread in `stream`'s order (`cudaLaunchHostFunc`).
    fn launch_host_func(&self, stream: StreamHandle, f: HostFn) -> Result<(), GpuError>;
}
