//! Property: every valid header a generator can build parses back to exactly the tensors
//! and metadata it was built from, and the same file with bytes appended is refused.

mod common;

use std::path::Path;

use proptest::prelude::*;
use sluice_formats::{parse_file_bytes, parse_header, parse_header_len, FormatError, PREFIX_BYTES};

proptest! {
    #[test]
    fn valid_headers_round_trip(file in common::valid_file(12)) {
        let header = parse_file_bytes(Path::new("gen.safetensors"), &file.bytes)
            .map_err(|err| TestCaseError::fail(err.to_string()))?;
        prop_assert_eq!(&header.tensors, &file.tensors);
        prop_assert_eq!(&header.metadata, &file.metadata);
        prop_assert_eq!(header.header_len, file.header_len);
        prop_assert_eq!(header.data_start, PREFIX_BYTES + file.header_len);
        prop_assert_eq!(header.data_len, file.data_len);
        let expected_bytes: u64 = file.tensors.iter().map(|t| t.end - t.start).sum();
        prop_assert_eq!(header.total_tensor_bytes(), expected_bytes);
        for tensor in &file.tensors {
            prop_assert_eq!(header.get(&tensor.name), Some(tensor));
        }
    }

    #[test]
    fn trailing_bytes_are_refused(file in common::valid_file(6), extra in 1u8..16) {
        let mut bytes = file.bytes.clone();
        bytes.extend(std::iter::repeat_n(0, usize::from(extra)));
        let err = parse_file_bytes(Path::new("gen.safetensors"), &bytes).unwrap_err();
        prop_assert!(matches!(err, FormatError::TrailingBytes { .. }), "{}", err);
    }

    #[test]
    fn split_parsing_agrees_with_whole_file_parsing(file in common::valid_file(6)) {
        let path = Path::new("gen.safetensors");
        let file_len = file.bytes.len() as u64;
        let header_len = parse_header_len(path, &file.bytes[..8], file_len).unwrap();
        let json = &file.bytes[8..8 + header_len as usize];
        prop_assert_eq!(
            parse_header(path, json, file_len).unwrap(),
            parse_file_bytes(path, &file.bytes).unwrap()
        );
    }
}
