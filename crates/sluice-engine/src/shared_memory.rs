//! [`SharedMemory`]: a sealed memfd mapped by two processes, and [`send_with_fd`] /
//! [`recv_with_fd`] to hand its descriptor over a Unix socket.
//!
//! Moving KV blocks between an engine and a sidecar through a socket would copy every
//! byte twice more. Instead the client creates a memfd, maps it, and passes the
//! descriptor (SCM_RIGHTS); the server maps the same pages, so a block crosses with no
//! copy beyond the one into or out of the engine's own buffer, and an O_DIRECT write
//! can go to disk straight from the shared pages (they are page-aligned).
//!
//! A server must not trust its client's memory: if a client shrank the memfd while the
//! server read it, the server would die of SIGBUS. So the creator seals the size
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before it shares the descriptor, and
//! [`SharedMemory::from_fd`] refuses a descriptor that is not sealed that way.

use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::mapping::{round_up_to_page, Mapping};
use crate::os_error::retry_eintr;

/// The seals a shared region must carry before a peer maps it.
const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A size-sealed memfd and a shared, writable mapping of all of it.
pub struct SharedMemory {
    fd: OwnedFd,
    map: Mapping,
}

impl SharedMemory {
    /// Creates `len` bytes (rounded up to a page) of zeroed shared memory named `name` (for
    /// `/proc/PID/maps`), sealed against resizing.
    pub fn create(name: &str, len: usize) -> io::Result<SharedMemory> {
        let len = round_up_to_page(len.max(1))?;
        let cname = CString::new(name).map_err(|_| invalid("memfd name holds a NUL byte"))?;
        // SAFETY: memfd_create with a valid C string; the result is checked.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).map_err(|_| invalid("size does not fit off_t"))?;
        // SAFETY: ftruncate and fcntl on the descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0
            || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) } != 0
        {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::file_shared_rw(fd.as_raw_fd(), len)?;
        Ok(SharedMemory { fd, map })
    }

    /// Maps a region a peer created and passed over a socket. Refused unless its size is
    /// sealed (so the peer cannot shrink it under us) and it holds at least `min_len`
    /// bytes and at most `max_len`.
    pub fn from_fd(fd: OwnedFd, min_len: usize, max_len: usize) -> io::Result<SharedMemory> {
        // SAFETY: F_GET_SEALS on a descriptor we own; a non-memfd gives EINVAL.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(invalid(
                "the shared region is not a memfd sealed against resizing (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL)",
            ));
        }
        // SAFETY: an all-zero stat is a valid out-parameter; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor we own into a stat we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = usize::try_from(st.st_size).map_err(|_| invalid("negative region size"))?;
        if len < min_len.max(1) || len > max_len {
            return Err(invalid(&format!(
                "the shared region is {len} bytes; this server takes {min_len} to {max_len}"
            )));
        }
        let map = Mapping::file_shared_rw(fd.as_raw_fd(), len)?;
        Ok(SharedMemory { fd, map })
    }

    /// First byte; page-aligned.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: a region holds at least a page.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The memfd, to pass to the peer.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("fd", &self.fd.as_raw_fd())
            .field("len", &self.len())
            .finish()
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

/// Sends all of `bytes` on `stream`, with `fd` attached (SCM_RIGHTS) to the first part.
pub fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut cmsg = CmsgBuf::new();
    let iov = [IoSlice::new(bytes)];
    // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.bytes.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.space();
    // SAFETY: the control buffer is CMSG_SPACE(one fd) long and aligned for cmsghdr, so
    // the first header and its data fit.
    unsafe {
        let hdr = libc::CMSG_FIRSTHDR(&msg);
        (*hdr).cmsg_level = libc::SOL_SOCKET;
        (*hdr).cmsg_type = libc::SCM_RIGHTS;
        (*hdr).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(hdr).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` points at live buffers; sendmsg only reads them.
    let sent =
        retry_eintr(|| unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })?;
    // The descriptor went with the first byte; the rest is plain data.
    use std::io::Write;
    (&*stream).write_all(&bytes[sent..])
}

/// Receives into `buf` (returns the bytes read, 0 at end of stream) and the descriptor
/// sent with them, if any. Descriptors beyond the first are closed.
pub fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut cmsg = CmsgBuf::new();
    let mut iov = [IoSliceMut::new(buf)];
    // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.bytes.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.space();
    // SAFETY: `msg` points at live, writable buffers of the lengths it gives.
    let n = retry_eintr(|| unsafe {
        libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC)
    })?;
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen; each
    // SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors now ours.
    unsafe {
        let mut hdr = libc::CMSG_FIRSTHDR(&msg);
        while !hdr.is_null() {
            if (*hdr).cmsg_level == libc::SOL_SOCKET && (*hdr).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(hdr).cast::<RawFd>();
                let count = ((*hdr).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            hdr = libc::CMSG_NXTHDR(&msg, hdr);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(invalid("more descriptors were sent than one"));
    }
    let first = (!fds.is_empty()).then(|| fds.remove(0));
    Ok((n, first)) // any others are closed as `fds` drops
}

/// A control-message buffer with room for one descriptor, aligned for `cmsghdr`.
struct CmsgBuf {
    bytes: [u64; 8],
}

impl CmsgBuf {
    fn new() -> CmsgBuf {
        CmsgBuf { bytes: [0; 8] }
    }

    fn space(&self) -> usize {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let want = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        debug_assert!(want <= std::mem::size_of_val(&self.bytes));
        want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_passed_over_a_socket_maps_the_same_pages() {
        let (a, b) = UnixStream::pair().unwrap();
        let region = SharedMemory::create("sluice-test", 10_000).unwrap();
        assert_eq!(region.len() % crate::page_size(), 0);
        send_with_fd(&a, b"hello", region.fd()).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let theirs = SharedMemory::from_fd(fd.unwrap(), 4096, 1 << 20).unwrap();
        // SAFETY: writing and reading inside both live mappings of one region.
        unsafe {
            *region.as_ptr().add(5000) = 0xA5;
            assert_eq!(*theirs.as_ptr().add(5000), 0xA5);
        }
    }

    #[test]
    fn unsealed_files_and_regions_of_the_wrong_size_are_refused() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let err = SharedMemory::from_fd(file.into(), 4096, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("sealed"), "{err}");

        let region = SharedMemory::create("sluice-test", 4096).unwrap();
        // SAFETY: dup of a live descriptor; the copy is owned by the OwnedFd.
        let dup = || unsafe { OwnedFd::from_raw_fd(libc::dup(region.fd())) };
        assert!(
            SharedMemory::from_fd(dup(), 8192, 1 << 20).is_err(),
            "too small"
        );
        assert!(SharedMemory::from_fd(dup(), 1, 1024).is_err(), "too large");
        // The sealed size cannot change.
        // SAFETY: ftruncate on a live descriptor.
        assert_ne!(unsafe { libc::ftruncate(region.fd(), 0) }, 0);
    }

    #[test]
    fn plain_data_arrives_without_a_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        use std::io::Write;
        (&a).write_all(b"xyz").unwrap();
        let mut buf = [0u8; 8];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fd.is_none()), (&b"xyz"[..], true));
        drop(a);
        assert_eq!(recv_with_fd(&b, &mut buf).unwrap().0, 0);
    }
}
