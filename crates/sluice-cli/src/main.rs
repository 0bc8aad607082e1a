//! `sluice`: parse arguments, run a command, map its outcome to an exit code.

use clap::Parser;

fn main() {
    let cli = sluice_cli::Cli::parse();
    sluice_cli::init_logging(cli.verbose);
    std::process::exit(sluice_cli::run(cli));
}
