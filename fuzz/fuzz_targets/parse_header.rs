//! Fuzz target: the safetensors header parser and the shard index parser.
//!
//! Every input is fed to both parsers. Beyond "no panic, no sanitizer report", an
//! accepted header is checked against the bytes it came from (sorted by offset, the spans
//! tile the data section exactly, as safetensors requires: every span inside the buffer,
//! none overlapping, no byte left over) and must assemble into a single-file checkpoint,
//! so logic errors in validation show up as crashes too.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_formats::{parse_file_bytes, parse_index, Checkpoint, CheckpointSource, Header, Shard};

fuzz_target!(|data: &[u8]| {
    let file = Path::new("fuzz.safetensors");
    if let Ok(header) = parse_file_bytes(file, data) {
        check_spans(&header, data);
        let shard = Shard {
            path: file.to_path_buf(),
            file_len: data.len() as u64,
            header,
        };
        let source = CheckpointSource::File(file.to_path_buf());
        assert!(Checkpoint::from_shards(source, vec![shard]).is_ok());
    }
    if let Ok(index) = parse_index(Path::new("fuzz.index.json"), data) {
        for name in index.shard_names() {
            assert!(!name.is_empty() && !name.contains('\0') && !name.starts_with('/'));
            assert!(!name.split(['/', '\\']).any(|part| part == ".."));
        }
    }
});

/// The properties a loader relies on when it trusts a parsed header, and the layout
/// safetensors requires: each tensor starts where the one before it ends.
fn check_spans(header: &Header, data: &[u8]) {
    assert_eq!(header.data_start + header.data_len, data.len() as u64);
    let mut covered = 0;
    for tensor in &header.tensors {
        assert_eq!(
            tensor.start, covered,
            "{} leaves a gap or overlaps",
            tensor.name
        );
        let start = usize::try_from(header.data_start + tensor.start).unwrap();
        let end = usize::try_from(header.data_start + tensor.end).unwrap();
        assert!(
            data.get(start..end).is_some(),
            "{} out of bounds",
            tensor.name
        );
        covered = tensor.end;
    }
    assert_eq!(covered, header.data_len, "trailing bytes");
}
