//! The wire protocol of `sluice kv serve`: requests from engine processes to the sidecar
//! that owns a KV store, and its replies, over a Unix stream socket.
//!
//! Only control travels on the socket: keys, flags, counts. Block bytes travel through a
//! shared-memory region the client creates and passes with its `Hello` (a sealed memfd,
//! `sluice_engine::SharedMemory`); a put or get names, per key, the byte offset of its
//! block in that region.
//!
//! A frame is `[u32 body length][u8 tag][body]`, little-endian. Strings and keys carry
//! their length first. The server decodes untrusted bytes, so every length is checked
//! against what is left of the frame and against the limits below before anything is
//! allocated, and a frame must be consumed exactly: decoding never panics, and a bad
//! frame is a [`WireError`] naming what was wrong.

use thiserror::Error;

/// The protocol version a `Hello` carries; a server refuses any other.
pub const WIRE_VERSION: u16 = 1;
/// Bytes before a frame's body: its length (u32) and tag (u8).
pub const FRAME_HEADER_BYTES: usize = 5;
/// The largest frame body either side accepts. 16 MiB holds a 4,096-key batch of the
/// longest keys a record can hold (4,000 bytes), and far more of the 16 to 64-byte hashes
/// engines use, while bounding what one bad length prefix can make a peer allocate.
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// The most keys one request may carry.
pub const MAX_BATCH_KEYS: usize = 1 << 16;
/// The longest string field (model names, formats, salts, messages).
pub const MAX_STRING_BYTES: usize = 4096;

/// A malformed frame.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame ends inside {what}")]
    Truncated { what: &'static str },
    #[error("unknown {what} tag {tag}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("{what} is {value}, above the limit of {max}")]
    TooLarge {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("{what} is not UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("{what}: {count} keys but {other} offsets")]
    Mismatch {
        what: &'static str,
        count: usize,
        other: usize,
    },
    #[error("{bytes} bytes left over after a {what}")]
    Trailing { what: &'static str, bytes: usize },
}

/// The namespace fields of `sluice_kv::Namespace`, as a client declares them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WireNamespace {
    pub model: String,
    pub dtype: String,
    pub tp_rank: u32,
    pub tp_size: u32,
    pub pp_stage: u32,
    pub kv_format: String,
    pub salt: String,
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// The first frame of a connection; its shared region's descriptor rides with it.
    Hello {
        version: u16,
        namespace: WireNamespace,
        /// Bytes of the shared region passed with this frame.
        shm_bytes: u64,
        /// The engine's prefill rate and tokens per block, for `worth_loading` lookups.
        recompute: Option<(f64, u64)>,
    },
    Lookup {
        lease: bool,
        worth_loading: bool,
        keys: Vec<Vec<u8>>,
    },
    /// Store the block at `offsets[i]` of the shared region under `keys[i]`.
    Put {
        keys: Vec<Vec<u8>>,
        offsets: Vec<u64>,
    },
    /// Load `keys[i]` into the shared region at `offsets[i]`.
    Get {
        keys: Vec<Vec<u8>>,
        offsets: Vec<u64>,
    },
    Stats,
    Sync,
    /// Delete `keys` (answered with the number the store held). Servers before
    /// 2026-11-28 do not know it: they answer it as an unknown request.
    Delete {
        keys: Vec<Vec<u8>>,
    },
}

/// Why a request failed, as the client's typed errors need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireErrorKind {
    /// The frame did not decode, or broke the protocol (the server then hangs up).
    BadRequest = 1,
    /// A key, offset or batch the store refuses.
    InvalidArgument = 2,
    /// A namespace or option the server refuses.
    Config = 3,
    /// The store is closing.
    Closed = 4,
    /// An I/O error of the server's own.
    Io = 5,
    /// The client speaks another protocol version.
    Version = 6,
    /// The server is at its connection limit.
    Busy = 7,
}

impl WireErrorKind {
    fn from_u8(v: u8) -> Option<WireErrorKind> {
        use WireErrorKind::*;
        [
            BadRequest,
            InvalidArgument,
            Config,
            Closed,
            Io,
            Version,
            Busy,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Hello {
        version: u16,
        /// Every block of the store is this long.
        block_bytes: u64,
        server_pid: u32,
    },
    /// A lookup's answer: keys found from the first.
    Count(u64),
    /// Per key: stored (put) or loaded (get).
    Flags(Vec<bool>),
    /// Stats, as JSON.
    Text(String),
    Done,
    Error {
        kind: WireErrorKind,
        message: String,
    },
}

const REQ_HELLO: u8 = 1;
const REQ_LOOKUP: u8 = 2;
const REQ_PUT: u8 = 3;
const REQ_GET: u8 = 4;
const REQ_STATS: u8 = 5;
const REQ_SYNC: u8 = 6;
const REQ_DELETE: u8 = 7;

const RESP_HELLO: u8 = 1;
const RESP_COUNT: u8 = 2;
const RESP_FLAGS: u8 = 3;
const RESP_TEXT: u8 = 4;
const RESP_DONE: u8 = 5;
const RESP_ERROR: u8 = 6;

impl Request {
    /// The whole frame: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::frame();
        let tag = match self {
            Request::Hello {
                version,
                namespace,
                shm_bytes,
                recompute,
            } => {
                w.u16(*version);
                w.namespace(namespace);
                w.u64(*shm_bytes);
                match recompute {
                    Some((rate, tokens)) => {
                        w.u8(1);
                        w.u64(rate.to_bits());
                        w.u64(*tokens);
                    }
                    None => w.u8(0),
                }
                REQ_HELLO
            }
            Request::Lookup {
                lease,
                worth_loading,
                keys,
            } => {
                w.u8(u8::from(*lease) | u8::from(*worth_loading) << 1);
                w.keys(keys);
                REQ_LOOKUP
            }
            Request::Put { keys, offsets } | Request::Get { keys, offsets } => {
                w.keys(keys);
                w.u32(offsets.len() as u32);
                offsets.iter().for_each(|o| w.u64(*o));
                match self {
                    Request::Put { .. } => REQ_PUT,
                    _ => REQ_GET,
                }
            }
            Request::Stats => REQ_STATS,
            Request::Sync => REQ_SYNC,
            Request::Delete { keys } => {
                w.keys(keys);
                REQ_DELETE
            }
        };
        w.finish(tag)
    }

    /// Decodes a frame's tag and body.
    pub fn decode(tag: u8, body: &[u8]) -> Result<Request, WireError> {
        let mut r = Reader { bytes: body };
        let req = match tag {
            REQ_HELLO => {
                let version = r.u16("version")?;
                let namespace = r.namespace()?;
                let shm_bytes = r.u64("shm_bytes")?;
                let recompute = match r.u8("recompute flag")? {
                    0 => None,
                    _ => Some((
                        f64::from_bits(r.u64("recompute rate")?),
                        r.u64("block tokens")?,
                    )),
                };
                Request::Hello {
                    version,
                    namespace,
                    shm_bytes,
                    recompute,
                }
            }
            REQ_LOOKUP => {
                let flags = r.u8("lookup flags")?;
                Request::Lookup {
                    lease: flags & 1 != 0,
                    worth_loading: flags & 2 != 0,
                    keys: r.keys()?,
                }
            }
            REQ_PUT | REQ_GET => {
                let keys = r.keys()?;
                let n = r.count("offset count", MAX_BATCH_KEYS, 8)?;
                let offsets = (0..n)
                    .map(|_| r.u64("offset"))
                    .collect::<Result<Vec<_>, _>>()?;
                if offsets.len() != keys.len() {
                    return Err(WireError::Mismatch {
                        what: "batch",
                        count: keys.len(),
                        other: offsets.len(),
                    });
                }
                match tag {
                    REQ_PUT => Request::Put { keys, offsets },
                    _ => Request::Get { keys, offsets },
                }
            }
            REQ_STATS => Request::Stats,
            REQ_SYNC => Request::Sync,
            REQ_DELETE => Request::Delete { keys: r.keys()? },
            tag => {
                return Err(WireError::UnknownTag {
                    what: "request",
                    tag,
                })
            }
        };
        r.end("request")?;
        Ok(req)
    }
}

impl Response {
    /// The whole frame: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::frame();
        let tag = match self {
            Response::Hello {
                version,
                block_bytes,
                server_pid,
            } => {
                w.u16(*version);
                w.u64(*block_bytes);
                w.u32(*server_pid);
                RESP_HELLO
            }
            Response::Count(n) => {
                w.u64(*n);
                RESP_COUNT
            }
            Response::Flags(flags) => {
                w.u32(flags.len() as u32);
                flags.iter().for_each(|f| w.u8(u8::from(*f)));
                RESP_FLAGS
            }
            Response::Text(text) => {
                w.bytes(text.as_bytes());
                RESP_TEXT
            }
            Response::Done => RESP_DONE,
            Response::Error { kind, message } => {
                w.u8(*kind as u8);
                let cut = floor_char_boundary(message, MAX_STRING_BYTES);
                w.bytes(&message.as_bytes()[..cut]);
                RESP_ERROR
            }
        };
        w.finish(tag)
    }

    /// Decodes a frame's tag and body.
    pub fn decode(tag: u8, body: &[u8]) -> Result<Response, WireError> {
        let mut r = Reader { bytes: body };
        let resp = match tag {
            RESP_HELLO => Response::Hello {
                version: r.u16("version")?,
                block_bytes: r.u64("block_bytes")?,
                server_pid: r.u32("server pid")?,
            },
            RESP_COUNT => Response::Count(r.u64("count")?),
            RESP_FLAGS => {
                let n = r.count("flag count", MAX_BATCH_KEYS, 1)?;
                let flags = (0..n)
                    .map(|_| r.u8("flag").map(|f| f != 0))
                    .collect::<Result<Vec<_>, _>>()?;
                Response::Flags(flags)
            }
            RESP_TEXT => Response::Text(r.string("text", MAX_FRAME_BYTES)?),
            RESP_DONE => Response::Done,
            RESP_ERROR => {
                let code = r.u8("error kind")?;
                let kind = WireErrorKind::from_u8(code).ok_or(WireError::UnknownTag {
                    what: "error kind",
                    tag: code,
                })?;
                Response::Error {
                    kind,
                    message: r.string("error message", MAX_STRING_BYTES)?,
                }
            }
            tag => {
                return Err(WireError::UnknownTag {
                    what: "response",
                    tag,
                })
            }
        };
        r.end("response")?;
        Ok(resp)
    }
}

/// The body length of a frame header, checked against [`MAX_FRAME_BYTES`], and its tag.
pub fn decode_frame_header(header: &[u8; FRAME_HEADER_BYTES]) -> Result<(usize, u8), WireError> {
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(WireError::TooLarge {
            what: "frame body",
            value: len as u64,
            max: MAX_FRAME_BYTES as u64,
        });
    }
    Ok((len, header[4]))
}

/// The largest index `<= i` on a char boundary of `s` (what `str::floor_char_boundary`
/// does on nightly).
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn frame() -> Writer {
        Writer {
            out: vec![0; FRAME_HEADER_BYTES],
        }
    }

    fn finish(mut self, tag: u8) -> Vec<u8> {
        let body = (self.out.len() - FRAME_HEADER_BYTES) as u32;
        self.out[..4].copy_from_slice(&body.to_le_bytes());
        self.out[4] = tag;
        self.out
    }

    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.out.extend_from_slice(b);
    }
    fn keys(&mut self, keys: &[Vec<u8>]) {
        self.u32(keys.len() as u32);
        for k in keys {
            self.u16(k.len() as u16);
            self.out.extend_from_slice(k);
        }
    }
    fn namespace(&mut self, ns: &WireNamespace) {
        for s in [&ns.model, &ns.dtype, &ns.kv_format, &ns.salt] {
            self.bytes(s.as_bytes());
        }
        for n in [ns.tp_rank, ns.tp_size, ns.pp_stage] {
            self.u32(n);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.bytes.len() {
            return Err(WireError::Truncated { what });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let b = self.take(N, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_item_bytes` each: no larger than `max`, nor than
    /// what the rest of the frame could hold, so a bad count allocates nothing.
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        min_item_bytes: usize,
    ) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        let fits = self.bytes.len() / min_item_bytes.max(1);
        if n > max {
            return Err(WireError::TooLarge {
                what,
                value: n as u64,
                max: max as u64,
            });
        }
        if n > fits {
            return Err(WireError::Truncated { what });
        }
        Ok(n)
    }

    fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(WireError::TooLarge {
                what,
                value: n as u64,
                max: max as u64,
            });
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::NotUtf8 { what })
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, WireError> {
        let n = self.count("key count", MAX_BATCH_KEYS, 2)?;
        let mut keys = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.u16("key length")? as usize;
            keys.push(self.take(len, "key")?.to_vec());
        }
        Ok(keys)
    }

    fn namespace(&mut self) -> Result<WireNamespace, WireError> {
        let model = self.string("model", MAX_STRING_BYTES)?;
        let dtype = self.string("dtype", MAX_STRING_BYTES)?;
        let kv_format = self.string("kv_format", MAX_STRING_BYTES)?;
        let salt = self.string("salt", MAX_STRING_BYTES)?;
        Ok(WireNamespace {
            model,
            dtype,
            kv_format,
            salt,
            tp_rank: self.u32("tp_rank")?,
            tp_size: self.u32("tp_size")?,
            pp_stage: self.u32("pp_stage")?,
        })
    }

    fn end(&self, what: &'static str) -> Result<(), WireError> {
        match self.bytes.len() {
            0 => Ok(()),
            bytes => Err(WireError::Trailing { what, bytes }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(frame: &[u8]) -> (u8, &[u8]) {
        let header: [u8; FRAME_HEADER_BYTES] = frame[..FRAME_HEADER_BYTES].try_into().unwrap();
        let (len, tag) = decode_frame_header(&header).unwrap();
        assert_eq!(len, frame.len() - FRAME_HEADER_BYTES);
        (tag, &frame[FRAME_HEADER_BYTES..])
    }

    fn requests() -> Vec<Request> {
        let keys = vec![b"k1".to_vec(), vec![0u8; 32], vec![]];
        vec![
            Request::Hello {
                version: WIRE_VERSION,
                namespace: WireNamespace {
                    model: "llama-3.1-8b".into(),
                    dtype: "bfloat16".into(),
                    tp_rank: 1,
                    tp_size: 2,
                    pp_stage: 0,
                    kv_format: "vllm".into(),
                    salt: "é".into(),
                },
                shm_bytes: 64 << 20,
                recompute: Some((8000.5, 16)),
            },
            Request::Lookup {
                lease: true,
                worth_loading: false,
                keys: keys.clone(),
            },
            Request::Put {
                keys: keys.clone(),
                offsets: vec![0, 4096, 8192],
            },
            Request::Get {
                keys,
                offsets: vec![1, 2, 3],
            },
            Request::Stats,
            Request::Sync,
            Request::Delete {
                keys: vec![b"gone".to_vec(), vec![7u8; 300]],
            },
        ]
    }

    fn responses() -> Vec<Response> {
        vec![
            Response::Hello {
                version: WIRE_VERSION,
                block_bytes: 2 << 20,
                server_pid: 42,
            },
            Response::Count(1000),
            Response::Flags(vec![true, false, true]),
            Response::Text("{\"hits\":3}".into()),
            Response::Done,
            Response::Error {
                kind: WireErrorKind::InvalidArgument,
                message: "key 3: 0 bytes".into(),
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for req in requests() {
            let frame = req.encode();
            let (tag, body) = split(&frame);
            assert_eq!(Request::decode(tag, body).unwrap(), req);
        }
        for resp in responses() {
            let frame = resp.encode();
            let (tag, body) = split(&frame);
            assert_eq!(Response::decode(tag, body).unwrap(), resp);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for req in requests() {
            let frame = req.encode();
            let (tag, body) = split(&frame);
            for cut in 0..body.len() {
                assert!(
                    Request::decode(tag, &body[..cut]).is_err(),
                    "{req:?} cut at {cut}"
                );
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(matches!(
                Request::decode(tag, &longer),
                Err(WireError::Trailing { .. })
            ));
        }
    }

    #[test]
    fn hostile_counts_and_lengths_are_refused_before_allocating() {
        // A key count of 2^32-1 in a 4-byte body.
        let body = u32::MAX.to_le_bytes();
        assert!(matches!(
            Request::decode(REQ_LOOKUP, &[&[0u8][..], &body].concat()),
            Err(WireError::TooLarge { .. })
        ));
        // A count under the limit but beyond what the frame holds.
        let body = [&[0u8][..], &1000u32.to_le_bytes()].concat();
        assert_eq!(
            Request::decode(REQ_LOOKUP, &body),
            Err(WireError::Truncated { what: "key count" })
        );
        let huge = [u32::MAX.to_le_bytes(), [0; 4]].concat();
        let header: [u8; 5] = [huge[0], huge[1], huge[2], huge[3], 1];
        assert!(decode_frame_header(&header).is_err());
        assert!(matches!(
            Request::decode(99, &[]),
            Err(WireError::UnknownTag { tag: 99, .. })
        ));
        // Keys and offsets that disagree.
        let mut w = Writer::frame();
        w.keys(&[b"a".to_vec()]);
        w.u32(0);
        let frame = w.finish(REQ_PUT);
        assert!(matches!(
            Request::decode(REQ_PUT, &frame[5..]),
            Err(WireError::Mismatch { .. })
        ));
    }

    #[test]
    fn long_error_messages_are_cut_on_a_character_boundary() {
        let message = "é".repeat(MAX_STRING_BYTES);
        let frame = Response::Error {
            kind: WireErrorKind::Io,
            message,
        }
        .encode();
        let (tag, body) = split(&frame);
        let Response::Error { message, .. } = Response::decode(tag, body).unwrap() else {
            panic!("not an error")
        };
        assert!(message.len() <= MAX_STRING_BYTES && message.chars().all(|c| c == 'é'));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(tag in 0u8..9, body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Request::decode(tag, &body);
            let _ = Response::decode(tag, &body);
        }

        #[test]
        fn arbitrary_batches_round_trip(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20),
            lease in any::<bool>(),
        ) {
            let offsets: Vec<u64> = (0..keys.len() as u64).map(|i| i * 4096).collect();
            for req in [
                Request::Lookup { lease, worth_loading: !lease, keys: keys.clone() },
                Request::Get { keys: keys.clone(), offsets },
            ] {
                let frame = req.encode();
                let (tag, body) = split(&frame);
                prop_assert_eq!(Request::decode(tag, body).unwrap(), req);
            }
        }
    }
}
