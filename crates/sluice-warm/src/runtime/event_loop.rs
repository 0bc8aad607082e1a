//! The runtime loop: access events to the policy, the policy's plans to the
//! page cache, until the service ends.
//!
//! [`Runtime`] owns a [`Manager`] over any [`PageCache`] and a list of
//! [`EventSource`]s, so the whole loop runs in tests over an in-memory
//! cache and scripted events, without root and without sleeping. Each
//! [`Runtime::turn`]:
//!
//! 1. asks every source for its events; the first may wait up to
//!    `idle_wait_ms` when there is nothing to prefetch (how an idle runtime
//!    waits without spinning), the others answer at once;
//! 2. hands each event to [`Runtime::handle`]: named as in the model
//!    directory, its worker found, shown to every source (the samplers
//!    start following its reader), its process registered with the cache
//!    (eviction pages its mappings out), the launch gate dropped (this is
//!    the service's first model access), then given to the policy;
//! 3. prefetches up to `chunks_per_turn` chunks, unless the launch gate
//!    holds them back while the service reads its own start-up files;
//! 4. every `tick_ms`, checks memory (evicting over the watermark).
//!
//! [`Runtime::run`] turns until the [`Service`] ends or a stop is
//! requested (ending the service is then [`super::shutdown`]'s), and
//! [`Runtime::finish`] takes the events that arrived meanwhile and stops
//! the policy (a recording writes its template there).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::error::WarmError;
use crate::idle_gate::{IdleGate, ServiceIo};
use crate::manager::{Manager, PageCache, Stats};
use crate::policy::{AccessEvent, PolicyContext};
use crate::runtime::{EventSource, ModelNames, Service, ServiceExit, SourceCounts, StopRequest};

/// Timings and bounds of the loop.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// How long a turn with nothing to prefetch waits for an event. 20 ms:
    /// a trigger or a sampler's progress is acted on within a frame of a
    /// loader's read, and an idle runtime wakes 50 times a second, which
    /// costs no measurable CPU.
    pub idle_wait_ms: u64,
    /// Prefetch chunks handed to the page cache per turn. 4: at the 8 MiB
    /// chunk of this machine's `read_ahead_kb` that is 32 MiB, about 25 ms
    /// of disk time, after which the loop looks at events again, so a
    /// reader's jump interrupts a stale plan within that.
    pub chunks_per_turn: usize,
    /// Memory is checked (and the policy asked to evict over the
    /// watermark) at most this often. 50 ms: a 1.5 GB/s prefetch adds about
    /// 75 MB between checks, well inside the 20% that the 0.8 watermark
    /// leaves below the limit.
    pub tick_ms: u64,
    /// Progress samplers run at most this often. 50 ms, as the tick: a
    /// sample walks /proc files per reader (about 0.1 ms each).
    pub sample_ms: u64,
    /// The status callback runs at most this often. 200 ms: five updates a
    /// second are smooth on a terminal and cheap for the status file.
    pub status_ms: u64,
    /// fanotify events that may wait for the policy. 4096: a loader's
    /// burst of 128 KiB reads over 512 MiB fits, and a full queue drops
    /// (and counts) events rather than block a reader.
    pub event_queue: usize,
    /// After the service ended, events the watch took before keep being
    /// handled until none arrives for this long. 20 ms: the watch thread
    /// hands over what the kernel queued within microseconds.
    pub final_drain_ms: u64,
}

impl Default for RuntimeConfig {
    fn default() -> RuntimeConfig {
        RuntimeConfig {
            idle_wait_ms: 20,
            chunks_per_turn: 4,
            tick_ms: 50,
            sample_ms: 50,
            status_ms: 200,
            event_queue: 4096,
            final_drain_ms: 20,
        }
    }
}

/// Live state, for the summary line and the status file.
pub struct Status<'a> {
    pub elapsed: Duration,
    pub stats: &'a Stats,
    pub pending_bytes: u64,
}

/// How a process's loader worker is found (`None`: the policy numbers
/// workers by the order their processes appear).
pub type WorkerLookup = fn(i32) -> Option<u32>;

/// The loop over a page cache `C`.
pub struct Runtime<C: PageCache> {
    manager: Manager<C>,
    config: RuntimeConfig,
    names: ModelNames,
    sources: Vec<Box<dyn EventSource>>,
    /// Holds launch prefetch back while the service reads its own files;
    /// dropped at its first model access.
    gate: Option<IdleGate<Box<dyn ServiceIo>>>,
    workers: HashMap<i32, Option<u32>>,
    worker_lookup: WorkerLookup,
    /// A daemon joins the memory cgroup of the first reader it sees.
    join_reader_cgroup: bool,
    joined: bool,
    started: Instant,
    last_tick: Instant,
    last_status: Instant,
}

impl<C: PageCache> Runtime<C> {
    /// A runtime over `manager` for a model whose files are named by
    /// `names`, with no event source yet.
    pub fn new(manager: Manager<C>, names: ModelNames, config: RuntimeConfig) -> Runtime<C> {
        let now = Instant::now();
        Runtime {
            manager,
            config,
            names,
            sources: Vec::new(),
            gate: None,
            workers: HashMap::new(),
            worker_lookup: |_| None,
            join_reader_cgroup: false,
            joined: false,
            started: now,
            last_tick: now,
            last_status: now,
        }
    }

    /// Adds an event source; the first one added is the one that waits.
    pub fn with_source(mut self, source: Box<dyn EventSource>) -> Runtime<C> {
        self.sources.push(source);
        self
    }

    /// Finds each process's loader worker with `lookup`.
    pub fn with_worker_lookup(mut self, lookup: WorkerLookup) -> Runtime<C> {
        self.worker_lookup = lookup;
        self
    }

    /// Holds prefetch back until `gate` opens or the service first touches
    /// the model.
    pub fn with_gate(mut self, gate: IdleGate<Box<dyn ServiceIo>>) -> Runtime<C> {
        self.gate = Some(gate);
        self
    }

    /// Joins the memory cgroup of the first reader seen (a daemon).
    pub fn with_reader_cgroup_join(mut self) -> Runtime<C> {
        self.join_reader_cgroup = true;
        self
    }

    /// Starts the policy with `ctx` and queues what it asks for at once;
    /// a policy that needs its prefetch done before the service starts
    /// (`precache`) gets it here.
    pub fn start(&mut self, ctx: &PolicyContext) {
        self.manager.start(ctx);
        if self.manager.wait_for_init() {
            self.manager.drain();
        }
    }

    /// One turn of the loop (see the module notes).
    pub fn turn(&mut self) {
        let open = match self.gate.as_mut() {
            Some(gate) if self.manager.has_pending() => gate.is_open(Instant::now()),
            _ => true,
        };
        let busy = self.manager.has_pending() && !self.manager.is_paused() && open;
        let wait = match busy {
            true => Duration::ZERO,
            false => Duration::from_millis(self.config.idle_wait_ms),
        };
        for i in 0..self.sources.len() {
            let events = self.sources[i].poll(if i == 0 { wait } else { Duration::ZERO });
            for event in events {
                self.handle(event);
            }
        }
        if open || self.gate.is_none() {
            self.manager.pump(self.config.chunks_per_turn);
        }
        if self.last_tick.elapsed() >= Duration::from_millis(self.config.tick_ms) {
            self.manager.tick();
            self.last_tick = Instant::now();
        }
    }

    /// One access event: named as in the model directory, its worker
    /// found, shown to the sources, its reader registered, then handed to
    /// the policy. Ends the launch gate: the service is at its model.
    pub fn handle(&mut self, mut event: AccessEvent) {
        event.path = self.names.model(event.path);
        if event.worker.is_none() && event.pid > 0 {
            let lookup = self.worker_lookup;
            event.worker = *self
                .workers
                .entry(event.pid)
                .or_insert_with(|| lookup(event.pid));
        }
        if self.join_reader_cgroup && !self.joined && event.pid > 0 {
            self.joined = super::join_reader_cgroup(event.pid).is_some();
        }
        let real = self.names.real(&event.path).to_path_buf();
        for source in &mut self.sources {
            source.observe(&event, &real);
        }
        if event.pid > 0 {
            self.manager.cache_mut().add_reader(event.pid);
        }
        self.gate = None;
        self.manager.on_event(&event);
    }

    /// Turns until `service` ends (how it ended) or a stop is requested
    /// (`None`: the service, if any, still runs), calling `on_status` every
    /// `status_ms`.
    pub fn run(
        &mut self,
        mut service: Option<&mut dyn Service>,
        stop: &StopRequest,
        on_status: &mut dyn FnMut(&Status),
    ) -> Result<Option<ServiceExit>, WarmError> {
        loop {
            if let Some(service) = service.as_deref_mut() {
                if let Some(exit) = service.try_exit()? {
                    return Ok(Some(exit));
                }
            }
            if stop.signal().is_some() {
                return Ok(None);
            }
            self.turn();
            if self.last_status.elapsed() >= Duration::from_millis(self.config.status_ms) {
                on_status(&Status {
                    elapsed: self.started.elapsed(),
                    stats: self.manager.stats(),
                    pending_bytes: self.manager.pending_bytes(),
                });
                self.last_status = Instant::now();
            }
        }
    }

    /// Ends the run: events the first source took before the service
    /// ended still count (a recording must not lose the last reads), then
    /// the policy stops.
    pub fn finish(&mut self) {
        let quiet = Duration::from_millis(self.config.final_drain_ms);
        while let Some(first) = self.sources.first_mut() {
            let events = first.poll(quiet);
            if events.is_empty() {
                break;
            }
            for event in events {
                self.handle(event);
            }
        }
        self.manager.stop();
    }

    /// What the sources counted, summed.
    pub fn counts(&self) -> SourceCounts {
        self.sources
            .iter()
            .map(|s| s.counts())
            .fold(SourceCounts::default(), |a, b| SourceCounts {
                events: a.events + b.events,
                answered: a.answered + b.answered,
                unanswered: a.unanswered + b.unanswered,
                dropped: a.dropped + b.dropped,
            })
    }

    pub fn manager(&self) -> &Manager<C> {
        &self.manager
    }

    pub fn manager_mut(&mut self) -> &mut Manager<C> {
        &mut self.manager
    }
}

#[cfg(test)]
mod tests;
