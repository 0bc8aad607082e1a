//! Frames on a Unix stream: `[u32 length][u8 tag][body]` (`sluice_formats::kv_wire`).

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use sluice_engine::recv_with_fd;
use sluice_formats::kv_wire::{decode_frame_header, FRAME_HEADER_BYTES};

/// Writes one whole frame.
pub(crate) fn write_frame(mut stream: &UnixStream, frame: &[u8]) -> io::Result<()> {
    stream.write_all(frame)
}

/// Reads one frame: its tag and body, or `None` when the peer closed the stream before
/// a new frame began. With `fd`, a descriptor sent with the frame's first bytes is kept
/// there.
pub(crate) fn read_frame(
    stream: &UnixStream,
    fd: Option<&mut Option<OwnedFd>>,
) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let mut got = match fd {
        Some(slot) => {
            let (n, received) = recv_with_fd(stream, &mut header)?;
            *slot = received;
            n
        }
        None => read_some(stream, &mut header)?,
    };
    if got == 0 {
        return Ok(None);
    }
    while got < FRAME_HEADER_BYTES {
        match read_some(stream, &mut header[got..])? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let (len, tag) = decode_frame_header(&header)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let mut body = vec![0u8; len];
    (&*stream).read_exact(&mut body)?;
    Ok(Some((tag, body)))
}

fn read_some(mut stream: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
