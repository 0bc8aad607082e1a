//! [`PythonPolicy`]: a [`WarmPolicy`] whose every call is a round trip to
//! its [`Host`].
//!
//! A call that fails in any way (the policy raised, missed its deadline,
//! the host exited, the reply is not one or fails
//! [`protocol`]'s checks) kills the host and is
//! [`WarmError::Policy`]; every later call fails at once, naming the first
//! fault. The guard ([`crate::policy::Guarded`]) turns that into "disabled
//! and logged".
//!
//! `wait_for_init` is asked once, right after `init`, because
//! [`WarmPolicy::wait_for_init`] cannot fail.

use std::time::Duration;

use serde_json::{json, Value};

use super::host::Host;
use super::protocol::{self, ModelFiles, ReplyError};
use crate::error::WarmError;
use crate::policy::{AccessEvent, FileRange, PolicyContext, Prefetch, WarmPolicy};
use crate::python_error::HostError;

/// A policy served by a `sluice.warm_host` child process.
pub struct PythonPolicy {
    spec: String,
    class: String,
    /// `None` after a fault or `exit`: the host was killed or has ended.
    pub(super) host: Option<Host>,
    /// Why the host is gone, when a fault ended it.
    fault: Option<String>,
    call_timeout: Duration,
    files: ModelFiles,
    wait_for_init: bool,
}

impl PythonPolicy {
    /// A policy served by `host`, which has said `hello` for `class`.
    pub(super) fn new(spec: &str, class: String, host: Host, call_timeout: Duration) -> Self {
        PythonPolicy {
            spec: spec.to_string(),
            class,
            host: Some(host),
            fault: None,
            call_timeout,
            files: ModelFiles::new(),
            wait_for_init: false,
        }
    }

    /// The Python class's name, as the host reported it.
    pub fn class_name(&self) -> &str {
        &self.class
    }

    /// The deadline of each call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// One round trip; `parse` checks the `ok` value. Any fault kills the
    /// host, and every later call fails at once.
    fn request<T>(
        &mut self,
        request: Value,
        parse: impl FnOnce(Value, &ModelFiles) -> Result<T, ReplyError>,
    ) -> Result<T, WarmError> {
        let outcome = match self.host.as_mut() {
            None => Err(format!(
                "the policy process is gone ({})",
                self.fault.as_deref().unwrap_or("exited")
            )),
            Some(host) => match host.call(&request, self.call_timeout) {
                Ok(value) => parse(value, &self.files).map_err(|e| format!("bad reply: {e}")),
                Err(HostError::Raised { message }) => Err(message),
                Err(e @ HostError::TimedOut { .. }) => Err(format!(
                    "the policy process {e} (SLUICE_PY_POLICY_TIMEOUT_MS)"
                )),
                Err(e) => Err(format!("the policy process {e}")),
            },
        };
        outcome.map_err(|message| {
            if let Some(host) = self.host.take() {
                drop(host);
                self.fault = Some(message.clone());
            }
            WarmError::Policy {
                name: self.spec.clone(),
                message,
            }
        })
    }
}

impl WarmPolicy for PythonPolicy {
    fn name(&self) -> &str {
        &self.spec
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        self.files = protocol::model_files(ctx);
        let request = json!({"call": "init", "ctx": protocol::ctx_json(ctx)});
        let prefetches = self.request(request, protocol::parse_prefetches)?;
        self.wait_for_init = self.request(
            json!({"call": "wait_for_init"}),
            protocol::parse_wait_for_init,
        )?;
        Ok(prefetches)
    }

    fn wait_for_init(&self) -> bool {
        self.wait_for_init
    }

    fn on_access(&mut self, event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        let request = json!({"call": "on_access", "event": protocol::event_json(event)});
        self.request(request, protocol::parse_prefetches)
    }

    fn evict(&mut self, event: Option<&AccessEvent>) -> Result<Vec<FileRange>, WarmError> {
        let request = json!({"call": "evict", "event": event.map(protocol::event_json)});
        self.request(request, protocol::parse_evictions)
    }

    fn exit(&mut self) -> Result<(), WarmError> {
        let outcome = self.request(json!({"call": "exit"}), protocol::parse_exit);
        if let Some(host) = self.host.take() {
            host.finish(self.call_timeout);
        }
        outcome
    }
}
