//! `sluice`: hand the arguments to the library and exit with its status.

fn main() {
    // Like other Unix tools, end quietly when the reader of our output goes
    // away (`sluice ... | head`) instead of panicking on EPIPE.
    // SAFETY: restoring the default disposition of a signal at start-up.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(sluice_cli::main_with_args(std::env::args_os()));
}
