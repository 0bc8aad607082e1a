//! [`FakeRuntime`]: a [`GpuRuntime`] for tests, on host memory, that records every call and
//! runs stream work only when asked, so that a test sees what a GPU would do later.
//!
//! "Device" addresses are host addresses the test owns. Work queued on a stream (copies,
//! event records, host functions, waits) stays queued until the test runs the stream, or
//! until a synchronising call needs it: a copy reads its source when it runs, as a DMA
//! engine does, so code that reuses a staging buffer before the copy from it has run copies
//! the wrong bytes here too. With `eager` every queued item runs at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::runtime::{CopyKind, EventHandle, GpuError, GpuRuntime, HostFn, StreamHandle};

/// Work on a stream, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeOp {
    Copy {
        dst: usize,
        src: usize,
        len: usize,
        kind: CopyKind,
    },
    Record(EventHandle),
    Wait(EventHandle),
    HostFunc,
}

/// One call into the fake, or one queued item running, in the order they happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeCall {
    Register { ptr: usize, len: usize },
    Unregister { ptr: usize },
    Queue(StreamHandle, FakeOp),
    Run(StreamHandle, FakeOp),
    Query(EventHandle),
    SyncEvent(EventHandle),
    SyncStream(StreamHandle),
}

enum Item {
    Op(FakeOp),
    Host(HostFn),
}

#[derive(Default)]
struct State {
    queues: HashMap<StreamHandle, VecDeque<Item>>,
    /// Per event: the stream and how many of its records are still queued.
    pending: HashMap<EventHandle, (StreamHandle, usize)>,
    next_event: usize,
    calls: Vec<FakeCall>,
    fail: Vec<&'static str>,
    registered: HashMap<usize, usize>,
}

/// See the module documentation.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    eager: bool,
    pins: bool,
}

impl FakeRuntime {
    /// Stream work waits until run ([`FakeRuntime::run`]) or synchronised.
    pub fn deferred() -> FakeRuntime {
        FakeRuntime {
            pins: true,
            ..FakeRuntime::default()
        }
    }

    /// Stream work runs as it is queued.
    pub fn eager() -> FakeRuntime {
        FakeRuntime {
            eager: true,
            pins: true,
            ..FakeRuntime::default()
        }
    }

    /// The next call of `call` (a [`GpuRuntime`] method name such as `"copy_async"`) fails
    /// with CUDA error 999; several entries fail several calls.
    pub fn fail_next(&self, call: &'static str) {
        self.lock().fail.push(call);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// How many calls so far match `pred`.
    pub fn count(&self, pred: impl Fn(&FakeCall) -> bool) -> usize {
        self.lock().calls.iter().filter(|c| pred(c)).count()
    }

    /// Host ranges registered and not yet unregistered: (address, length).
    pub fn registered(&self) -> Vec<(usize, usize)> {
        self.lock()
            .registered
            .iter()
            .map(|(p, l)| (*p, *l))
            .collect()
    }

    /// Items queued on `stream` and not yet run.
    pub fn queued(&self, stream: StreamHandle) -> usize {
        self.lock().queues.get(&stream).map_or(0, VecDeque::len)
    }

    /// Runs up to `n` queued items of `stream`, oldest first; returns how many ran.
    pub fn run(&self, stream: StreamHandle, n: usize) -> usize {
        (0..n).take_while(|_| self.run_one(stream)).count()
    }

    /// Runs every stream to its end.
    pub fn run_all(&self) {
        let streams: Vec<StreamHandle> = self.lock().queues.keys().copied().collect();
        for s in streams {
            while self.run_one(s) {}
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn injected(&self, call: &'static str) -> Result<(), GpuError> {
        let mut st = self.lock();
        if let Some(i) = st.fail.iter().position(|c| *c == call) {
            st.fail.remove(i);
            return Err(GpuError::Call {
                call,
                code: 999,
                message: "injected by FakeRuntime".into(),
            });
        }
        Ok(())
    }

    fn queue(&self, stream: StreamHandle, item: Item) {
        {
            let mut st = self.lock();
            let op = match &item {
                Item::Op(op) => op.clone(),
                Item::Host(_) => FakeOp::HostFunc,
            };
            if let FakeOp::Record(ev) = op {
                let e = st.pending.entry(ev).or_insert((stream, 0));
                *e = (stream, e.1 + 1);
            }
            st.calls.push(FakeCall::Queue(stream, op));
            st.queues.entry(stream).or_default().push_back(item);
        }
        if self.eager {
            while self.run_one(stream) {}
        }
    }

    /// Runs the oldest item of `stream`; false when there was none.
    fn run_one(&self, stream: StreamHandle) -> bool {
        let item = {
            let mut st = self.lock();
            match st.queues.get_mut(&stream).and_then(VecDeque::pop_front) {
                Some(item) => item,
                None => return false,
            }
        };
        match item {
            Item::Host(f) => {
                self.lock()
                    .calls
                    .push(FakeCall::Run(stream, FakeOp::HostFunc));
                f();
            }
            Item::Op(op) => {
                if let FakeOp::Wait(ev) = op {
                    self.complete(ev);
                }
                let mut st = self.lock();
                match op {
                    FakeOp::Copy { dst, src, len, .. } => {
                        // SAFETY: the GpuRuntime::copy_async contract: both ranges are valid
                        // until the copy has run, which is now.
                        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
                    }
                    FakeOp::Record(ev) => {
                        if let Some(e) = st.pending.get_mut(&ev) {
                            e.1 -= 1;
                        }
                    }
                    FakeOp::Wait(_) | FakeOp::HostFunc => {}
                }
                st.calls.push(FakeCall::Run(stream, op));
            }
        }
        true
    }

    /// Runs `ev`'s stream until its queued records have run.
    fn complete(&self, ev: EventHandle) {
        loop {
            let (stream, left) = self
                .lock()
                .pending
                .get(&ev)
                .copied()
                .unwrap_or((StreamHandle(0), 0));
            if left == 0 || !self.run_one(stream) {
                return;
            }
        }
    }
}

impl GpuRuntime for FakeRuntime {
    fn describe(&self) -> String {
        "fake CUDA runtime (tests)".into()
    }

    fn pins_memory(&self) -> bool {
        self.pins
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize) -> Result<(), GpuError> {
        self.injected("host_register")?;
        let mut st = self.lock();
        st.calls.push(FakeCall::Register {
            ptr: ptr as usize,
            len,
        });
        if st.registered.insert(ptr as usize, len).is_some() {
            return Err(GpuError::Call {
                call: "host_register",
                code: 712, // cudaErrorHostMemoryAlreadyRegistered
                message: "already registered".into(),
            });
        }
        Ok(())
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<(), GpuError> {
        self.injected("host_unregister")?;
        let mut st = self.lock();
        st.calls.push(FakeCall::Unregister { ptr: ptr as usize });
        match st.registered.remove(&(ptr as usize)) {
            Some(_) => Ok(()),
            None => Err(GpuError::Call {
                call: "host_unregister",
                code: 713, // cudaErrorHostMemoryNotRegistered
                message: "not registered".into(),
            }),
        }
    }

    unsafe fn copy_async(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        kind: CopyKind,
        stream: StreamHandle,
    ) -> Result<(), GpuError> {
        self.injected("copy_async")?;
        self.queue(
            stream,
            Item::Op(FakeOp::Copy {
                dst,
                src,
                len,
                kind,
            }),
        );
        Ok(())
    }

    fn event_create(&self) -> Result<EventHandle, GpuError> {
        self.injected("event_create")?;
        let mut st = self.lock();
        st.next_event += 1;
        Ok(EventHandle(st.next_event))
    }

    fn event_destroy(&self, event: EventHandle) {
        self.lock().pending.remove(&event);
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<(), GpuError> {
        self.injected("event_record")?;
        self.queue(stream, Item::Op(FakeOp::Record(event)));
        Ok(())
    }

    fn event_query(&self, event: EventHandle) -> Result<bool, GpuError> {
        self.injected("event_query")?;
        let mut st = self.lock();
        st.calls.push(FakeCall::Query(event));
        Ok(st.pending.get(&event).is_none_or(|e| e.1 == 0))
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<(), GpuError> {
        self.injected("event_synchronize")?;
        self.lock().calls.push(FakeCall::SyncEvent(event));
        self.complete(event);
        Ok(())
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> Result<(), GpuError> {
        self.injected("stream_synchronize")?;
        self.lock().calls.push(FakeCall::SyncStream(stream));
        while self.run_one(stream) {}
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<(), GpuError> {
        self.injected("stream_wait_event")?;
        self.queue(stream, Item::Op(FakeOp::Wait(event)));
        Ok(())
    }

    fn launch_host_func(&self, stream: StreamHandle, f: HostFn) -> Result<(), GpuError> {
        self.injected("launch_host_func")?;
        self.queue(stream, Item::Host(f));
        Ok(())
    }
}
