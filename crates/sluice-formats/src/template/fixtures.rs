//! Templates and hand-made template bytes shared by the unit tests.

use super::encode::put_bytes;
use super::{ServiceId, Template, TemplateFile, TemplateRange, WorkerSequence, MAGIC, VERSION};

pub const MIB: u64 = 1 << 20;

pub fn range(file: u32, offset: u64, len: u64) -> TemplateRange {
    TemplateRange { file, offset, len }
}

pub fn file(path: &str, size: u64) -> TemplateFile {
    TemplateFile {
        path: path.into(),
        size,
        mtime_ns: 1_700_000_000_123_456_789,
    }
}

/// Two files (one in a subdirectory, with a negative mtime), two workers with gaps in
/// their numbers, ranges that go forward, backward, across files and up to a file's end.
pub fn sample() -> Template {
    Template {
        service: ServiceId::from_spec("llama-3-8b tp=2"),
        spec: "llama-3-8b tp=2".into(),
        files: vec![
            file("model-00001-of-00002.safetensors", 10 << 30),
            TemplateFile {
                mtime_ns: -42,
                ..file("sub/model-00002-of-00002.safetensors", 5000)
            },
        ],
        workers: vec![
            WorkerSequence {
                worker: 0,
                ranges: vec![
                    range(0, 0, 4096),
                    range(0, 8192, MIB),
                    range(1, 100, 900),
                    range(0, 4096, 10),
                    range(0, (10 << 30) - 1, 1),
                ],
            },
            WorkerSequence {
                worker: 3,
                ranges: vec![range(1, 4000, 1000)],
            },
        ],
    }
}

/// Header, service id and a one-byte spec, as a hand-made body starts.
pub fn body_start() -> Vec<u8> {
    let mut body = MAGIC.to_vec();
    body.extend_from_slice(&VERSION.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&[7u8; 32]);
    put_bytes(&mut body, b"s");
    body
}

/// `body` with a valid checksum, as a hostile writer would make it.
pub fn sealed(mut body: Vec<u8>) -> Vec<u8> {
    let checksum = blake3::hash(&body);
    body.extend_from_slice(checksum.as_bytes());
    body
}
