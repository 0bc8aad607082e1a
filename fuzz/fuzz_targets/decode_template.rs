//! Fuzz target: the `.sluicetpl` template decoder.
//!
//! Each input is decoded as it is, and again with its last 32 bytes replaced by the blake3
//! of the rest, so that mutations get past the checksum and reach the checks of meaning (a
//! hostile writer can seal anything). Beyond "no panic, no sanitizer report", every
//! template the decoder accepts must be one a replay can trust and the codec can keep:
//! it passes `validate`, every range lies inside its file's recorded size, and it
//! re-encodes to bytes (no longer than the input) that decode to the same template and
//! re-encode to themselves.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_formats::template::{check_relative_path, Template};

/// Bytes of the blake3 trailer.
const CHECKSUM_BYTES: usize = 32;

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&resealed(data));
});

fn resealed(data: &[u8]) -> Vec<u8> {
    let body = &data[..data.len().saturating_sub(CHECKSUM_BYTES)];
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(blake3::hash(body).as_bytes());
    bytes
}

fn check(bytes: &[u8]) {
    let Ok(template) = Template::decode(bytes) else {
        return;
    };
    assert_eq!(template.validate(), Ok(()));
    check_meaning(&template);
    let encoded = template.encode();
    assert!(
        encoded.len() <= bytes.len(),
        "the encoder writes the shortest form"
    );
    let again = Template::decode(&encoded).expect("a re-encoded template decodes");
    assert_eq!(again, template);
    assert_eq!(again.encode(), encoded, "encoding is stable");
}

/// What a replay relies on, checked independently of `validate`.
fn check_meaning(template: &Template) {
    for file in &template.files {
        assert!(check_relative_path(&file.path).is_ok(), "{:?}", file.path);
    }
    for pair in template.workers.windows(2) {
        assert!(pair[0].worker < pair[1].worker);
    }
    for seq in &template.workers {
        for range in &seq.ranges {
            let file = &template.files[range.file as usize];
            assert!(range.len > 0);
            assert!(range.offset.checked_add(range.len).unwrap() <= file.size);
        }
    }
}
