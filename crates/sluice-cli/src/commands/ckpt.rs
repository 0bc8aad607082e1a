//! `sluice ckpt`: list the checkpoints of a store, describe one, verify its chunks,
//! compare two, and collect garbage.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use sluice_ckpt::{diff, CkptError, CkptPath, CkptStore, Manifest};

use crate::{CkptDiffArgs, CkptGcArgs, CkptLsArgs, CkptPathArgs};

/// Why a `sluice ckpt` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CkptCliError {
    #[error(transparent)]
    Ckpt(#[from] CkptError),
    /// `verify` found bad chunks.
    #[error("{0}")]
    Damaged(String),
}

impl sluice_engine::Classify for CkptCliError {
    fn class(&self) -> sluice_engine::ErrorClass {
        match self {
            CkptCliError::Ckpt(e) => e.class(),
            CkptCliError::Damaged(_) => sluice_engine::ErrorClass::Failed,
        }
    }
}

/// Threads hashing chunks: the machine's cores.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A checkpoint path `<store>/<name>` as its store and name (checked as every front
/// checks it: `sluice_ckpt::CkptPath`).
fn split(path: &Path) -> Result<(PathBuf, String), CkptError> {
    let p = CkptPath::parse_path(path)?;
    Ok((p.root, p.name))
}

use super::human_bytes as human;

/// `sluice ckpt ls STORE`.
pub fn ls(args: &CkptLsArgs) -> Result<(), CkptCliError> {
    let infos = CkptStore::open_existing(&args.path)?.infos()?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&infos).unwrap_or_default()
        );
        return Ok(());
    }
    outln!(
        "{:<24} {:>8} {:>12} {:>12} {:>12}",
        "checkpoint",
        "entries",
        "logical",
        "unique",
        "shared"
    );
    for i in &infos {
        outln!(
            "{:<24} {:>8} {:>12} {:>12} {:>12}",
            i.name,
            i.entries,
            human(i.logical_bytes),
            human(i.unique_bytes),
            human(i.shared_bytes)
        );
    }
    let stored: u64 = CkptStore::open_existing(&args.path)?
        .chunks()
        .list()?
        .iter()
        .map(|(_, n)| n)
        .sum();
    outln!(
        "{} checkpoints, {} of chunks stored",
        infos.len(),
        human(stored)
    );
    Ok(())
}

/// `sluice ckpt inspect STORE/NAME`.
pub fn inspect(args: &CkptPathArgs) -> Result<(), CkptCliError> {
    let (root, name) = split(&args.path)?;
    let store = CkptStore::open_existing(&root)?;
    let m = store.manifest(&name)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
        return Ok(());
    }
    let unique: u64 = m.unique_chunks().values().sum();
    let logical = m.logical_bytes();
    for (key, e) in &m.entries {
        let shape = e
            .shape
            .as_ref()
            .map(|s| format!("{s:?}"))
            .unwrap_or_default();
        // A small entry lives in a pack shared with others: say which, not "0 chunks".
        let place = match &e.pack {
            Some(p) => format!("in pack {}", &p.digest.hex()[..12]),
            None => format!("{} chunks", e.chunks.len()),
        };
        outln!(
            "{key:<48} {:<10} {:<16} {:>10} {place}",
            e.dtype.as_deref().unwrap_or("bytes"),
            shape,
            human(e.nbytes),
        );
    }
    let ratio = if unique == 0 {
        1.0
    } else {
        logical as f64 / unique as f64
    };
    outln!(
        "{} entries, {} logical, {} in {} unique chunks (dedup ratio {ratio:.2}), world size {}",
        m.entries.len(),
        human(logical),
        human(unique),
        m.unique_chunks().len(),
        m.world_size
    );
    Ok(())
}

/// `sluice ckpt verify STORE/NAME`: exit 1 if any chunk is bad.
pub fn verify(args: &CkptPathArgs) -> Result<(), CkptCliError> {
    let (root, name) = split(&args.path)?;
    let bar = if args.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let r = CkptStore::open_existing(&root)?.verify_with(&name, threads(), &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        for (d, entry, why) in &r.problems {
            outln!("{entry}: chunk {d}: {why}");
        }
        outln!(
            "{} chunks, {} verified, {} bad",
            r.chunks,
            human(r.bytes),
            r.problems.len()
        );
    }
    match r.problems.len() {
        0 => Ok(()),
        n => Err(CkptCliError::Damaged(format!(
            "{}: {n} bad chunks",
            args.path.display()
        ))),
    }
}

/// `sluice ckpt diff STORE/A STORE/B`.
pub fn diff_cmd(args: &CkptDiffArgs) -> Result<(), CkptCliError> {
    let read = |p: &Path| -> Result<Manifest, CkptError> {
        let (root, name) = split(p)?;
        CkptStore::open_existing(&root)?.manifest(&name)
    };
    let d = diff(&read(&args.a)?, &read(&args.b)?);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
        return Ok(());
    }
    for (key, bytes) in &d.changed {
        outln!("changed  {key} ({} of new chunks)", human(*bytes));
    }
    for key in &d.added {
        outln!("added    {key}");
    }
    for key in &d.removed {
        outln!("removed  {key}");
    }
    outln!(
        "{} changed ({} of new chunks), {} added, {} removed",
        d.changed.len(),
        human(d.changed_bytes),
        d.added.len(),
        d.removed.len()
    );
    Ok(())
}

/// `sluice ckpt gc STORE --keep N`.
pub fn gc(args: &CkptGcArgs) -> Result<(), CkptCliError> {
    let grace = std::time::Duration::from_secs_f64(args.grace_s);
    let r = CkptStore::open_exclusive(&args.path)?.gc_with(args.keep, grace)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        return Ok(());
    }
    for name in &r.checkpoints_removed {
        outln!("removed  {name}");
    }
    outln!(
        "{} checkpoints removed, {} chunks freed ({}), {} temporaries",
        r.checkpoints_removed.len(),
        r.chunks_removed,
        human(r.bytes_freed),
        r.temporaries_removed
    );
    Ok(())
}
