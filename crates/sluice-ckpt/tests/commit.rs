//! A grouped save's commit files (issue 27): a rank that looks after the publisher has
//! published, cleaned up and exited must read that as success, not as a death.

use std::path::Path;
use std::time::Duration;

use sluice_ckpt::{Commit, Manifest};

fn join(root: &Path, token: &str, rank: usize) -> Commit {
    Commit::join(root, "s", token, rank, 2, true, Duration::from_secs(30)).unwrap()
}

/// What rank 0 does once every share is durable: publish this save's manifest, remove
/// the commit files, exit (its liveness lock goes with it).
fn publish_and_exit(root: &Path, publisher: Commit) {
    let mut m = Manifest::new(4096, 2);
    m.extra = serde_json::json!({ "save_id": publisher.token() });
    m.write(&root.join("s")).unwrap();
    publisher.clean_up();
    drop(publisher);
}

#[test]
fn a_successor_that_looks_after_the_publisher_exited_does_not_stand_in() {
    // The false stand-in: rank 1 found rank 0's marker gone (cleaned up) and its lock free
    // (exited), and wrote rank 0's share again, reporting it had stood in for it.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let token = "0123456789abcdef";
    let (r0, r1) = (join(dir.path(), token, 0), join(dir.path(), token, 1));
    r0.mark_durable(0, &serde_json::json!({})).unwrap();
    r1.mark_durable(1, &serde_json::json!({})).unwrap();
    publish_and_exit(dir.path(), r0);
    assert!(!r1.must_stand_in().unwrap());
    r1.wait_published().unwrap();
}
