//! [`CudaRuntime`]: `libcudart` opened at run time.
//!
//! Sluice links no CUDA library. A process that already loaded a CUDA runtime (torch's, from
//! its `nvidia-cuda-runtime` wheel) gets that one: the same library, context and streams as
//! the tensors Sluice is handed. Otherwise the usual sonames are tried on the loader's path,
//! or the file `SLUICE_CUDART` names.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::runtime::{CopyKind, EventHandle, GpuError, GpuRuntime, HostFn, StreamHandle};

/// Sonames tried in order, newest first.
const SONAMES: [&str; 4] = [
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so",
];
const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_NOT_READY: c_int = 600;
const EVENT_DISABLE_TIMING: c_uint = 0x02;
const HOST_REGISTER_DEFAULT: c_uint = 0;

type Err = c_int;
type Stream = *mut c_void;
type Event = *mut c_void;

type ErrorStringFn = unsafe extern "C" fn(Err) -> *const c_char;
type IntOutFn = unsafe extern "C" fn(*mut c_int) -> Err;
type HostRegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> Err;
type PtrFn = unsafe extern "C" fn(*mut c_void) -> Err;
type MemcpyAsyncFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> Err;
type EventCreateFn = unsafe extern "C" fn(*mut Event, c_uint) -> Err;
type EventStreamFn = unsafe extern "C" fn(Event, Stream) -> Err;
type StreamEventFn = unsafe extern "C" fn(Stream, Event, c_uint) -> Err;
type HostFnTrampoline = unsafe extern "C" fn(*mut c_void);
type LaunchHostFuncFn = unsafe extern "C" fn(Stream, HostFnTrampoline, *mut c_void) -> Err;

/// The entry points, resolved once.
struct Api {
    get_error_string: ErrorStringFn,
    get_device_count: IntOutFn,
    runtime_get_version: IntOutFn,
    host_register: HostRegisterFn,
    host_unregister: PtrFn,
    memcpy_async: MemcpyAsyncFn,
    event_create_with_flags: EventCreateFn,
    event_destroy: PtrFn,
    event_record: EventStreamFn,
    event_query: PtrFn,
    event_synchronize: PtrFn,
    stream_synchronize: PtrFn,
    stream_wait_event: StreamEventFn,
    launch_host_func: LaunchHostFuncFn,
}

/// The CUDA runtime library, opened with `dlopen` and never closed (CUDA's own state
/// outlives any one user of it).
pub struct CudaRuntime {
    api: Api,
    path: String,
    version: i32,
}

// SAFETY: the CUDA runtime API is thread-safe; `Api` holds only function pointers.
unsafe impl Send for CudaRuntime {}
// SAFETY: as above.
unsafe impl Sync for CudaRuntime {}

impl CudaRuntime {
    /// The runtime this process already has loaded, else the first soname the loader finds,
    /// else `SLUICE_CUDART`'s file; and at least one CUDA device. The error says what was
    /// tried.
    pub fn load() -> Result<CudaRuntime, GpuError> {
        let explicit = std::env::var("SLUICE_CUDART").ok();
        let mut tried = Vec::new();
        let candidates: Vec<(String, c_int)> = SONAMES
            .iter()
            .map(|n| (n.to_string(), libc::RTLD_NOW | libc::RTLD_NOLOAD))
            .chain(explicit.iter().map(|p| (p.clone(), libc::RTLD_NOW)))
            .chain(SONAMES.iter().map(|n| (n.to_string(), libc::RTLD_NOW)))
            .collect();
        for (name, flags) in candidates {
            let Ok(cname) = CString::new(name.clone()) else {
                continue;
            };
            // SAFETY: a NUL-terminated name; dlopen has no other precondition.
            let handle = unsafe { libc::dlopen(cname.as_ptr(), flags | libc::RTLD_LOCAL) };
            if handle.is_null() {
                if flags & libc::RTLD_NOLOAD == 0 {
                    tried.push(format!("{name}: {}", dlerror()));
                }
                continue;
            }
            let rt = CudaRuntime::from_handle(handle, name)?;
            rt.check_device()?;
            return Ok(rt);
        }
        Err(GpuError::NoRuntime {
            reason: format!("no libcudart could be opened ({})", tried.join("; ")),
        })
    }

    /// The library's path (or the soname it was found by) and its runtime version.
    pub fn version(&self) -> i32 {
        self.version
    }

    fn from_handle(handle: *mut c_void, name: String) -> Result<CudaRuntime, GpuError> {
        macro_rules! sym {
            ($s:literal, $t:ty) => {{
                let cname = concat!($s, "\0");
                // SAFETY: `handle` is a live dlopen handle and the name is NUL-terminated.
                let p = unsafe { libc::dlsym(handle, cname.as_ptr().cast()) };
                if p.is_null() {
                    return Err(GpuError::NoRuntime {
                        reason: format!("{name} has no symbol {}", $s),
                    });
                }
                // SAFETY: the CUDA runtime exports this symbol with the signature of the
                // field it is stored into (cuda_runtime_api.h).
                unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
            }};
        }
        let api = Api {
            get_error_string: sym!("cudaGetErrorString", ErrorStringFn),
            get_device_count: sym!("cudaGetDeviceCount", IntOutFn),
            runtime_get_version: sym!("cudaRuntimeGetVersion", IntOutFn),
            host_register: sym!("cudaHostRegister", HostRegisterFn),
            host_unregister: sym!("cudaHostUnregister", PtrFn),
            memcpy_async: sym!("cudaMemcpyAsync", MemcpyAsyncFn),
            event_create_with_flags: sym!("cudaEventCreateWithFlags", EventCreateFn),
            event_destroy: sym!("cudaEventDestroy", PtrFn),
            event_record: sym!("cudaEventRecord", EventStreamFn),
            event_query: sym!("cudaEventQuery", PtrFn),
            event_synchronize: sym!("cudaEventSynchronize", PtrFn),
            stream_synchronize: sym!("cudaStreamSynchronize", PtrFn),
            stream_wait_event: sym!("cudaStreamWaitEvent", StreamEventFn),
            launch_host_func: sym!("cudaLaunchHostFunc", LaunchHostFuncFn),
        };
        let mut version = 0;
        // SAFETY: a valid out-pointer.
        unsafe { (api.runtime_get_version)(&mut version) };
        let path = loaded_path(handle).unwrap_or(name);
        Ok(CudaRuntime { api, path, version })
    }

    fn check_device(&self) -> Result<(), GpuError> {
        let mut count = 0;
        // SAFETY: a valid out-pointer.
        let code = unsafe { (self.api.get_device_count)(&mut count) };
        if code != CUDA_SUCCESS || count == 0 {
            return Err(GpuError::NoRuntime {
                reason: format!(
                    "{} reports no CUDA device ({})",
                    self.path,
                    self.message(code)
                ),
            });
        }
        Ok(())
    }

    fn message(&self, code: Err) -> String {
        // SAFETY: cudaGetErrorString returns a static string for every code.
        let p = unsafe { (self.api.get_error_string)(code) };
        if p.is_null() {
            return format!("error {code}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &'static str, code: Err) -> Result<(), GpuError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(GpuError::Call {
            call,
            code,
            message: self.message(code),
        })
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next call.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "not found".into();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The file a dlopen handle came from, through one of its symbols.
fn loaded_path(handle: *mut c_void) -> Option<String> {
    // SAFETY: a live handle and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c"cudaGetErrorString".as_ptr()) };
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `sym` is an address inside the library; `info` is a valid out-pointer.
    if sym.is_null() || unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr's file name is NUL-terminated and lives as long as the library.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Runs a [`HostFn`] queued by [`CudaRuntime::launch_host_func`], once.
unsafe extern "C" fn run_host_fn(data: *mut c_void) {
    // SAFETY: `data` is the `Box<HostFn>` leaked by `launch_host_func`, run exactly once.
    let f = unsafe { Box::from_raw(data.cast::<HostFn>()) };
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        tracing::error!("a host function queued on a CUDA stream panicked");
    }
}

impl GpuRuntime for CudaRuntime {
    fn describe(&self) -> String {
        format!(
            "CUDA runtime {}.{} ({})",
            self.version / 1000,
            self.version % 1000 / 10,
            self.path
        )
    }

    fn pins_memory(&self) -> bool {
        true
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize) -> Result<(), GpuError> {
        // SAFETY: the caller's contract.
        let code = unsafe { (self.api.host_register)(ptr.cast(), len, HOST_REGISTER_DEFAULT) };
        self.check("cudaHostRegister", code)
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<(), GpuError> {
        // SAFETY: the caller's contract.
        let code = unsafe { (self.api.host_unregister)(ptr.cast()) };
        self.check("cudaHostUnregister", code)
    }

    unsafe fn copy_async(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        kind: CopyKind,
        stream: StreamHandle,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.api.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                len,
                kind as c_int,
                stream.0 as Stream,
            )
        };
        self.check("cudaMemcpyAsync", code)
    }

    fn event_create(&self) -> Result<EventHandle, GpuError> {
        let mut ev: Event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let code = unsafe { (self.api.event_create_with_flags)(&mut ev, EVENT_DISABLE_TIMING) };
        self.check("cudaEventCreateWithFlags", code)?;
        Ok(EventHandle(ev as usize))
    }

    fn event_destroy(&self, event: EventHandle) {
        // SAFETY: an event this runtime created.
        let code = unsafe { (self.api.event_destroy)(event.0 as Event) };
        if let Err(e) = self.check("cudaEventDestroy", code) {
            tracing::warn!("{e}");
        }
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<(), GpuError> {
        // SAFETY: an event this runtime created; the stream is the caller's.
        let code = unsafe { (self.api.event_record)(event.0 as Event, stream.0 as Stream) };
        self.check("cudaEventRecord", code)
    }

    fn event_query(&self, event: EventHandle) -> Result<bool, GpuError> {
        // SAFETY: an event this runtime created.
        let code = unsafe { (self.api.event_query)(event.0 as Event) };
        if code == CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.check("cudaEventQuery", code).map(|()| true)
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<(), GpuError> {
        // SAFETY: an event this runtime created.
        let code = unsafe { (self.api.event_synchronize)(event.0 as Event) };
        self.check("cudaEventSynchronize", code)
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), GpuError> {
        // SAFETY: the caller's stream.
        let code = unsafe { (self.api.stream_synchronize)(stream.0 as Stream) };
        self.check("cudaStreamSynchronize", code)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<(), GpuError> {
        // SAFETY: the caller's stream, an event this runtime created.
        let code = unsafe { (self.api.stream_wait_event)(stream.0 as Stream, event.0 as Event, 0) };
        self.check("cudaStreamWaitEvent", code)
    }

    fn launch_host_func(&self, stream: StreamHandle, f: HostFn) -> Result<(), GpuError> {
        let data = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: `run_host_fn` takes back the box exactly once, when the stream runs it.
        let code = unsafe { (self.api.launch_host_func)(stream.0 as Stream, run_host_fn, data) };
        if code != CUDA_SUCCESS {
            // Not queued: the box is still ours.
            // SAFETY: `data` came from Box::into_raw above and was not handed over.
            drop(unsafe { Box::from_raw(data.cast::<HostFn>()) });
        }
        self.check("cudaLaunchHostFunc", code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_loading_is_an_error_naming_what_was_tried() {
        // This machine kind has no CUDA runtime; where one is installed the test has nothing
        // to check.
        match CudaRuntime::load() {
            Ok(rt) => eprintln!("skipped: a CUDA runtime is present: {}", rt.describe()),
            Err(GpuError::NoRuntime { reason }) => {
                assert!(
                    reason.contains("libcudart") || reason.contains("no CUDA device"),
                    "{reason}"
                )
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
