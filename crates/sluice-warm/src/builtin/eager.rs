//! `eager`: on the first access, prefetch every model file at full
//! concurrency (one stream per file); never evict.

use super::whole_model;
use crate::error::WarmError;
use crate::policy::{AccessEvent, PolicyContext, Prefetch, WarmPolicy};

/// Everything, at the first sign of a reader.
#[derive(Default)]
pub struct Eager {
    plan: Vec<Prefetch>,
    started: bool,
}

impl WarmPolicy for Eager {
    fn name(&self) -> &str {
        "eager"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        self.plan = whole_model(ctx);
        Ok(Vec::new())
    }

    fn on_access(&mut self, _event: &AccessEvent) -> Result<Vec<Prefetch>, WarmError> {
        if self.started {
            return Ok(Vec::new());
        }
        self.started = true;
        Ok(std::mem::take(&mut self.plan))
    }
}
