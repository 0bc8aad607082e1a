//! `precache`: prefetch every model file before the service starts.

use super::whole_model;
use crate::error::WarmError;
use crate::policy::{PolicyContext, Prefetch, WarmPolicy};

/// Everything, before the service starts.
pub struct Precache;

impl WarmPolicy for Precache {
    fn name(&self) -> &str {
        "precache"
    }

    fn needs_read_ranges(&self) -> bool {
        false
    }

    fn init(&mut self, ctx: &PolicyContext) -> Result<Vec<Prefetch>, WarmError> {
        Ok(whole_model(ctx))
    }

    fn wait_for_init(&self) -> bool {
        true
    }
}
