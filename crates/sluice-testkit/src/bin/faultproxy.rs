//! `sluice-faultproxy`: a TCP proxy that adds latency and injects faults,
//! for tests and benchmarks against a local S3 server (in place of netem).
//! It parses flags, binds, prints `listening ADDR` on stdout and runs
//! [`sluice_testkit::faultproxy::run`] until SIGTERM/SIGINT or `--die-after`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sluice_testkit::faultproxy::{self, FaultProxyConfig, ResponseFault};
use tokio::net::TcpListener;

/// Forwards TCP connections to an upstream, adding a one-way delay in each
/// direction (a round trip costs 2 × --delay-ms) and faults on response
/// bytes. Prints `listening ADDR` once bound.
#[derive(Parser)]
#[command(name = "sluice-faultproxy")]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where to forward each connection, HOST:PORT.
    #[arg(long)]
    upstream: String,
    /// Latency added to every byte in each direction, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Reset (RST) a faulty connection after this many response bytes.
    #[arg(long, value_name = "BYTES", group = "fault")]
    reset_after: Option<u64>,
    /// Close a faulty connection cleanly (FIN) after this many response bytes.
    #[arg(long, value_name = "BYTES", group = "fault")]
    truncate_after: Option<u64>,
    /// Stop sending on a faulty connection after this many response bytes,
    /// keeping it open.
    #[arg(long, value_name = "BYTES", group = "fault")]
    stall_after: Option<u64>,
    /// Apply the fault to the first N connections only (default: all).
    #[arg(long, value_name = "N", requires = "fault")]
    faulty: Option<u64>,
    /// After this many response bytes over all connections, reset every
    /// connection, stop listening and exit 0.
    #[arg(long, value_name = "BYTES")]
    die_after: Option<u64>,
}

impl Args {
    fn config(&self) -> FaultProxyConfig {
        let mut config = FaultProxyConfig::new(&self.upstream)
            .with_one_way_delay(Duration::from_millis(self.delay_ms));
        let fault = (self
            .reset_after
            .map(|after_bytes| ResponseFault::Reset { after_bytes }))
        .or(self
            .truncate_after
            .map(|after_bytes| ResponseFault::Truncate { after_bytes }))
        .or(self
            .stall_after
            .map(|after_bytes| ResponseFault::Stall { after_bytes }));
        if let Some(fault) = fault {
            config = config.with_response_fault(fault);
        }
        if let Some(count) = self.faulty {
            config = config.with_faulty_connections(count);
        }
        if let Some(bytes) = self.die_after {
            config = config.with_die_after_bytes(bytes);
        }
        config
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(err) = tokio::net::lookup_host(&args.upstream).await {
        eprintln!("sluice-faultproxy: --upstream {}: {err}", args.upstream);
        return ExitCode::from(2);
    }
    let listener = match TcpListener::bind(&args.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("sluice-faultproxy: cannot listen on {}: {err}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(err) => {
            eprintln!("sluice-faultproxy: local address of {}: {err}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "listening {addr}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    faultproxy::run(listener, args.config(), termination()).await;
    ExitCode::SUCCESS
}

/// Completes on SIGTERM or SIGINT.
async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            eprintln!("sluice-faultproxy: cannot watch SIGTERM: {err}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
