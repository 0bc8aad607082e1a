//! Reading what the kernel hands over: events in a buffer, their info
//! records, and the answer to a permission event. Every length from the
//! kernel is checked before anything is sliced.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use super::{WatchStats, FAN_EVENT_INFO_TYPE_RANGE, METADATA_LEN};

/// Attempts at writing one permission answer: a write interrupted by a
/// signal is retried, and two more tries cost nothing next to a reader
/// blocked for good.
const ANSWER_ATTEMPTS: u32 = 3;

/// Allows the access of permission event `meta` and counts the answer only
/// when the kernel took it. A failed answer is logged and counted in
/// [`WatchStats::unanswered`]: `ENOENT` means the kernel no longer waits
/// for it (the reader died), anything else leaves the reader blocked until
/// the group closes, which the runtime reports.
pub(super) fn answer(group: RawFd, meta: &libc::fanotify_event_metadata, stats: &WatchStats) {
    let response = libc::fanotify_response {
        fd: meta.fd,
        response: libc::FAN_ALLOW,
    };
    let size = std::mem::size_of::<libc::fanotify_response>();
    let mut last = None;
    for _ in 0..ANSWER_ATTEMPTS {
        // SAFETY: writing a response struct that lives across the call to
        // the group descriptor.
        let rc = unsafe {
            libc::write(
                group,
                (&response as *const libc::fanotify_response).cast(),
                size,
            )
        };
        if rc == size as isize {
            stats.answered.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let err = if rc < 0 {
            std::io::Error::last_os_error()
        } else {
            std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {rc}"))
        };
        let retry = err.kind() == std::io::ErrorKind::Interrupted;
        last = Some(err);
        if !retry {
            break;
        }
    }
    stats.unanswered.fetch_add(1, Ordering::Relaxed);
    if let Some(err) = last {
        tracing::warn!(
            "fanotify: could not answer the access of pid {} (event fd {}): {err}",
            meta.pid,
            meta.fd
        );
    }
}

/// Calls `f` with each well-formed event of a buffer read from a fanotify
/// group, and its info records. The kernel's lengths are checked before
/// anything is sliced: an event whose `metadata_len` is below the struct or
/// past its `event_len` is still handed over, with no info records (its
/// descriptor must be answered and closed); an `event_len` below the struct
/// or past the buffer ends the walk, since neither that event nor anything
/// after it can be located. Returns how many events were damaged.
pub(super) fn for_each_event(
    buf: &[u8],
    mut f: impl FnMut(libc::fanotify_event_metadata, &[u8]),
) -> u64 {
    let mut damaged = 0;
    let mut at = 0usize;
    while let Some(rest) = buf.get(at..).filter(|rest| !rest.is_empty()) {
        let Some(meta) = read_metadata(rest) else {
            return damaged + 1;
        };
        let len = meta.event_len as usize;
        // The kernel copies whole events only, so a length below the
        // struct or past the buffer means nothing in it can be trusted, not
        // even its descriptor (closing a wrong one would break another part
        // of this process): stop here.
        let Some(event) = rest.get(..len).filter(|_| len >= METADATA_LEN) else {
            return damaged + 1;
        };
        let info = match event.get(meta.metadata_len as usize..) {
            Some(info) if meta.metadata_len as usize >= METADATA_LEN => info,
            _ => {
                damaged += 1;
                &[]
            }
        };
        f(meta, info);
        at += len;
    }
    damaged
}

/// The event metadata at the start of `bytes`, or `None` when fewer bytes
/// than the struct are left.
fn read_metadata(bytes: &[u8]) -> Option<libc::fanotify_event_metadata> {
    let head = bytes.get(..METADATA_LEN)?;
    // SAFETY: `head` holds METADATA_LEN bytes, the struct is plain integers
    // (any bit pattern is valid), and read_unaligned copes with any
    // alignment.
    Some(unsafe { std::ptr::read_unaligned(head.as_ptr().cast()) })
}

/// The range record of a pre-content event: header (type u8, pad u8, len
/// u16), u32 pad, u64 offset, u64 count.
pub(super) fn parse_range(mut info: &[u8]) -> Option<(u64, u64)> {
    while info.len() >= 4 {
        let kind = info[0];
        let len = u16::from_ne_bytes([info[2], info[3]]) as usize;
        if len < 4 || len > info.len() {
            return None;
        }
        if kind == FAN_EVENT_INFO_TYPE_RANGE && len >= 24 {
            let offset = u64::from_ne_bytes(info[8..16].try_into().ok()?);
            let count = u64::from_ne_bytes(info[16..24].try_into().ok()?);
            return Some((offset, count));
        }
        info = &info[len..];
    }
    None
}
