//! Cutting state into content-addressed chunks.
//!
//! Every tensor (or bytes item) is cut on its own, so a chunk never spans two tensors
//! (a tensor boundary is always a cut), into pieces of `chunk_bytes` with a shorter last
//! one. Each piece is named by its BLAKE3 digest: identical bytes anywhere (a tied weight,
//! a replicated parameter, an optimizer moment that is still all zeros, a tensor that did
//! not change since the last save) are one chunk, stored once.
//!
//! Hashing runs on `threads` threads, chunk by chunk; BLAKE3 itself is SIMD within a chunk.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A chunk's name: the BLAKE3 digest of its bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl std::hash::Hash for Digest {
    /// Its first 8 bytes: a digest is uniformly random already (and hashing 8 bytes, not
    /// 32 plus a length, keeps pooling a group's digests cheap).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(w));
    }
}

/// A hasher for maps keyed by [`Digest`]: the digest's own bits, no mixing.
#[derive(Default, Clone, Copy)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than a Digest: fold them in (FNV-1a).
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// `HashMap<Digest, _, DigestBuild>`: maps keyed by digests.
pub type DigestBuild = std::hash::BuildHasherDefault<DigestHasher>;

impl Digest {
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.hex()[..16])
    }
}

impl FromStr for Digest {
    type Err = String;
    fn from_str(s: &str) -> Result<Digest, String> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{s:?} is not a 64-digit hex BLAKE3 digest"));
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Digest(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One chunk of an entry: its digest and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    #[serde(rename = "d")]
    pub digest: Digest,
    #[serde(rename = "n")]
    pub len: u64,
}

/// Cuts `bytes` into chunks of `chunk_bytes` (the last one shorter) and hashes them on up
/// to `threads` threads. An empty entry has no chunks.
pub fn chunk(bytes: &[u8], chunk_bytes: usize, threads: usize) -> Vec<ChunkRef> {
    let pieces: Vec<&[u8]> = bytes.chunks(chunk_bytes.max(1)).collect();
    let digests = parallel_map(&pieces, threads, |p| Digest::of(p));
    pieces
        .iter()
        .zip(digests)
        .map(|(p, digest)| ChunkRef {
            digest,
            len: p.len() as u64,
        })
        .collect()
}

/// The digests of `pieces`, hashed on up to `threads` threads together (many small pieces
/// cost one pool of threads, not one per piece).
pub fn hash_all(pieces: &[&[u8]], threads: usize) -> Vec<Digest> {
    // Pieces are dealt out in runs of about a megabyte, so tiny ones do not each pay for a
    // trip through the work queue.
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, p) in pieces.iter().enumerate() {
        bytes += p.len().max(64);
        if bytes >= 1 << 20 {
            runs.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < pieces.len() {
        runs.push(start..pieces.len());
    }
    parallel_map(&runs, threads, |r| {
        pieces[r.clone()]
            .iter()
            .map(|p| Digest::of(p))
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// `f` over `items` on up to `threads` scoped threads; results in order.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 || threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    let slots: Vec<std::sync::Mutex<&mut Option<R>>> =
        out.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { return };
                let r = f(item);
                **slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    drop(slots);
    out.into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_at_the_size_and_name_their_bytes() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        let c = chunk(&bytes, 4096, 4);
        assert_eq!(
            c.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![4096, 4096, 1808]
        );
        assert_eq!(c[0].digest, Digest::of(&bytes[..4096]));
        assert_eq!(c[2].digest, Digest::of(&bytes[8192..]));
        assert!(chunk(&[], 4096, 4).is_empty());
        // Equal bytes, equal names: zeros dedup.
        let zeros = vec![0u8; 3 * 4096];
        let z = chunk(&zeros, 4096, 2);
        assert!(z.iter().all(|c| c.digest == z[0].digest));
    }

    #[test]
    fn digests_round_trip_as_hex_and_bad_hex_is_refused() {
        let d = Digest::of(b"x");
        assert_eq!(d.hex().parse::<Digest>().unwrap(), d);
        assert!("zz".parse::<Digest>().is_err());
        assert!("g".repeat(64).parse::<Digest>().is_err());
        let json = serde_json::to_string(&ChunkRef { digest: d, len: 1 }).unwrap();
        assert_eq!(serde_json::from_str::<ChunkRef>(&json).unwrap().digest, d);
    }
}
