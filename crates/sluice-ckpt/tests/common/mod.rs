//! Helpers shared by the checkpoint store's integration tests.

/// Bytes that never repeat within a chunk or across chunks (unlike a short period).
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(&[seed]);
    h.finalize_xof().fill(&mut out);
    out
}
