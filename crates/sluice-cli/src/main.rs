//! `sluice`: parse arguments, run a command, map its outcome to an exit code.

use clap::Parser;

fn main() {
    // Like other Unix tools, end quietly when the reader of our output goes
    // away (`sluice ... | head`) instead of panicking on EPIPE.
    // SAFETY: restoring the default disposition of a signal at start-up.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = sluice_cli::Cli::parse();
    sluice_cli::init_logging(cli.verbose);
    std::process::exit(sluice_cli::run(cli));
}
