//! `sluice kv serve PATH --socket SOCK`: owns a store and serves it to engine processes
//! (`sluice.kv.connect`) until SIGINT, SIGTERM or SIGHUP, then ends every session, syncs
//! and closes the store, and removes the socket.

use std::sync::atomic::{AtomicBool, Ordering};

use sluice_kv::{KvConfig, KvServer, KvServerConfig, KvStore, Namespace};

use super::kv::{apply_tiers, named, parse_size, KvCliError};
use crate::KvServeArgs;

/// Set by the stop signals.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP.store(true, Ordering::Release);
}

/// `sluice kv serve`.
pub fn serve(args: &KvServeArgs) -> Result<(), KvCliError> {
    let config = store_config(args)?;
    let server_config = KvServerConfig {
        max_clients: args.max_clients,
        socket_mode: u32::from_str_radix(&args.socket_mode, 8).map_err(|_| {
            KvCliError::Usage(format!(
                "--socket-mode {:?}: an octal mode such as 600 or 660",
                args.socket_mode
            ))
        })?,
        ..KvServerConfig::default()
    };
    if server_config.max_clients == 0 {
        return Err(KvCliError::Usage(
            "--max-clients 0: serve at least one".into(),
        ));
    }
    let store = KvStore::open(&args.path, config)?;
    let server = match KvServer::bind(store.clone(), &args.socket, server_config) {
        Ok(s) => s,
        Err(e) => {
            store.close()?;
            return Err(e.into());
        }
    };
    STOP.store(false, Ordering::Release);
    let handlers = super::signals::install(on_signal);
    errln!(
        "sluice kv serve: {} on {} (pid {}, {}-byte blocks, {}); stop with Ctrl-C or SIGTERM",
        args.path.display(),
        args.socket.display(),
        std::process::id(),
        store.config().block_bytes,
        super::kv::describe_tiers(store.config())
    );
    let served = server.run(&|| STOP.load(Ordering::Acquire));
    drop(server);
    handlers.restore();
    let closed = store.close();
    let s = store.stats();
    errln!(
        "sluice kv serve: stopped; {} puts, {} gets ({} DRAM hits, {} SSD hits, {} misses), {} blocks stored",
        s.puts,
        s.gets,
        s.hits_dram,
        s.hits_ssd,
        s.misses,
        s.ssd.as_ref().or(s.dram.as_ref()).map_or(0, |t| t.blocks)
    );
    served?;
    Ok(closed?)
}

/// The store the flags describe. Clients bring their own namespaces; the store's own is
/// only what its handle in this process would use.
fn store_config(args: &KvServeArgs) -> Result<KvConfig, KvCliError> {
    let block_bytes = match &args.block_bytes {
        Some(b) => parse_size("block-bytes", b)?,
        None => match sluice_kv::read_manifest(&args.path) {
            Ok(m) => m.block_bytes,
            Err(_) => {
                return Err(KvCliError::Usage(format!(
                    "{}: no store there yet; --block-bytes sizes a new one",
                    args.path.display()
                )))
            }
        },
    };
    let mut c = KvConfig::new(block_bytes, Namespace::default());
    apply_tiers(&mut c, &args.tiers)?;
    c.write_mode = named("write-mode", &args.write_mode)?;
    c.durability = named("durability", &args.durability)?;
    c.validate()?;
    Ok(c)
}
