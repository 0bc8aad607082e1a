//! Blocking positional reads with the retry rules every engine shares.

use std::io;

use crate::io_engine::ReadOp;

/// Reads `op.len` bytes with `pread`, retrying short reads and EINTR, and
/// demoting the file to buffered reads once if O_DIRECT is refused (EINVAL).
/// Returns the bytes read, fewer than asked only at end of file.
pub fn pread_full(op: &ReadOp) -> io::Result<usize> {
    let dst = op.dst()?;
    if let Some(remote) = op.file.remote_reader() {
        // SAFETY: `dst .. dst + len` lies inside the op's buffer (checked by
        // `op.dst()`), and only this op writes that range while it runs.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, op.len) };
        let end = op.file.len().saturating_sub(op.offset).min(op.len as u64) as usize;
        return remote.read_at(op.offset, &mut dst[..end]);
    }
    let mut done = 0usize;
    while done < op.len {
        let fd = op.file.read_fd()?;
        let was_direct = op.file.is_direct();
        let offset = op.offset + done as u64;
        let Ok(off) = libc::off_t::try_from(offset) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offset {offset} too large"),
            ));
        };
        // SAFETY: `dst + done .. dst + len` lies inside the op's buffer
        // (checked by `op.dst()`), and only this op writes that range.
        let n = unsafe { libc::pread(fd, dst.add(done).cast(), op.len - done, off) };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                Some(libc::EINVAL) if was_direct => {
                    op.file.demote(&err);
                    continue;
                }
                _ => return Err(err),
            }
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}
