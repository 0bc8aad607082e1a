//! Sharing one store across processes: `sluice kv serve`, a sidecar that owns the store,
//! and [`KvClient`], what engine processes (TP ranks, several engines) call instead.
//!
//! Why a sidecar and not a lock discipline on the segment files (docs/design/kv.md has
//! the measurements): the policies' state, the DRAM tier, the leases and the space
//! accounting all live in one process's memory, and the simulator's prediction holds
//! only for one policy instance seeing every access. Several owners of one directory
//! would each need a share of the budget, their own policy and a way to see each other's
//! appends. One owner, with clients over a Unix socket, keeps every guarantee of the
//! single-process store.
//!
//! Moving parts:
//! - [`KvServer`] accepts connections on a Unix socket and runs one thread per client. A
//!   client's first frame (`Hello`) declares its namespace and carries, as SCM_RIGHTS, a
//!   sealed memfd (`sluice_engine::SharedMemory`) that both sides map. Each request names
//!   keys and, for puts and gets, where each block lies in that region, so block bytes
//!   never cross the socket. A get writes the region; a put reads it (and O_DIRECT writes
//!   straight from its page-aligned pages).
//! - [`KvClient`] keeps a few connections, each with its own region, and splits batches
//!   larger than a region. It fails open: when the server is gone, calls answer as misses
//!   (lookup 0, put and get `false`) and it reconnects after `retry_ms`, so an engine
//!   keeps serving, recomputing what it cannot load.
//! - The wire format is `sluice_formats::kv_wire`; every frame from a client is decoded
//!   as untrusted bytes, every offset checked against the region, and a bad frame ends
//!   that client's connection only.

mod client;
mod frame;
mod server;

pub use client::{KvClient, KvClientConfig};
pub use server::{KvServer, KvServerConfig};

/// The longest path a Unix socket takes: `sun_path` holds 108 bytes, the last a NUL.
const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Refuses a socket path the kernel cannot bind or connect to, naming it and the limit (a
/// usage error, not an I/O failure).
fn check_socket_path(socket: &std::path::Path) -> Result<(), crate::error::KvError> {
    let len = socket.as_os_str().len();
    if len <= MAX_SOCKET_PATH_BYTES {
        return Ok(());
    }
    Err(crate::error::KvError::config(
        "socket",
        socket.display(),
        format!(
            "{len} bytes long, but a Unix socket path is at most {MAX_SOCKET_PATH_BYTES} bytes: use a shorter path"
        ),
    ))
}
