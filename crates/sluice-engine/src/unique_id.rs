//! [`unique_hex`]: a random id for a store or a save, unique across processes and time.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

/// `digits` lowercase hex digits of randomness from the kernel (`/dev/urandom`); where that
/// cannot be read, mixed from the clock, the pid and a counter (unique, if not secret).
pub fn unique_hex(digits: usize) -> String {
    let mut bytes = vec![0u8; digits.div_ceil(2)];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut x =
            now ^ (u64::from(std::process::id()) << 32) ^ NEXT.fetch_add(1, Ordering::Relaxed);
        for chunk in bytes.chunks_mut(8) {
            // splitmix64: every step a well-mixed 64-bit word.
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex[..digits].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_length_asked_and_differ() {
        let a = unique_hex(16);
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, unique_hex(16));
        assert_eq!(unique_hex(5).len(), 5);
    }
}
