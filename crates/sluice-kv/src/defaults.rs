//! [`KvDefaults`]: the default of every store, client and server option, taken from the
//! configs that own them ([`KvConfig::new`], [`KvClientConfig::new`],
//! [`KvServerConfig::default`]). The CLI's flags and the Python API read their defaults
//! from here instead of repeating the numbers, so the reasons stay with the configs and
//! nothing drifts.

use serde::Serialize;

use crate::config::KvConfig;
use crate::namespace::Namespace;
use crate::serve::{KvClientConfig, KvServerConfig};

/// The defaults of `sluice.kv.open`, `sluice.kv.connect` and `sluice kv serve`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KvDefaults {
    /// Both tiers' policy (`dram_policy`, `ssd_policy`), by `sluice sim` name.
    pub policy: String,
    pub shared_policy: String,
    pub write_mode: &'static str,
    pub durability: &'static str,
    pub direct: &'static str,
    pub engine: &'static str,
    pub io_threads: usize,
    pub lease_timeout_ms: u64,
    pub segment_bytes: u64,
    pub shared_refresh_ms: u64,
    pub remote_timeout_ms: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
    /// `sluice.kv.connect`.
    pub shm_bytes: u64,
    pub connections: usize,
    pub retry_ms: u64,
    pub timeout_ms: u64,
    /// `sluice kv serve`.
    pub max_clients: usize,
    /// Octal, as `--socket-mode` takes it.
    pub socket_mode: String,
}

/// The defaults, from the configs that own them.
pub fn kv_defaults() -> KvDefaults {
    let c = KvConfig::new(1, Namespace::default());
    let client = KvClientConfig::new(Namespace::default());
    let server = KvServerConfig::default();
    KvDefaults {
        policy: c.ssd_policy.kind().name().to_string(),
        shared_policy: c.shared_policy.kind().name().to_string(),
        write_mode: c.write_mode.name(),
        durability: c.durability.name(),
        direct: c.direct.name(),
        engine: match c.engine {
            sluice_engine::EngineChoice::Auto => "auto",
            sluice_engine::EngineChoice::IoUring => "io_uring",
            sluice_engine::EngineChoice::Threads => "threads",
        },
        io_threads: c.io_threads,
        lease_timeout_ms: c.lease_timeout_ms,
        segment_bytes: c.segment_bytes,
        shared_refresh_ms: c.shared_refresh_ms,
        remote_timeout_ms: c.remote_timeout_ms,
        high_watermark: c.high_watermark,
        low_watermark: c.low_watermark,
        shm_bytes: client.shm_bytes,
        connections: client.connections,
        retry_ms: client.retry_ms,
        timeout_ms: client.timeout_ms,
        max_clients: server.max_clients,
        socket_mode: format!("{:o}", server.socket_mode),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_parse_back_into_the_configs_values() {
        let d = kv_defaults();
        let c = KvConfig::new(1, Namespace::default());
        assert_eq!(
            d.write_mode.parse::<crate::WriteMode>().unwrap(),
            c.write_mode
        );
        assert_eq!(
            d.durability.parse::<crate::Durability>().unwrap(),
            c.durability
        );
        assert_eq!(d.direct.parse::<crate::DirectIo>().unwrap(), c.direct);
        assert_eq!(
            d.engine.parse::<sluice_engine::EngineChoice>().unwrap(),
            c.engine
        );
        assert_eq!(u32::from_str_radix(&d.socket_mode, 8).unwrap(), 0o600);
    }
}
