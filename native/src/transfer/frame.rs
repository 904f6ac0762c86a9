//! The transfer engine's wire format: small control frames, checked before anything
//! is allocated or read (XFER-3).
//!
//! A frame is a 4-byte little-endian length, then that many bytes: one kind byte and
//! its fields. Lengths above [`MAX_FRAME`] are refused without reading further. Data
//! never travels inside a frame: a `Read` is answered by a [`Status`] header and then
//! exactly the requested bytes, which the receiver reads straight into memory it
//! allocated before asking; a `Write` is followed by exactly `len` raw bytes.

/// Largest control frame (after the length prefix).
pub const MAX_FRAME: usize = 1024;
/// HMAC-SHA256 size, and the nonce size.
pub const MAC_LEN: usize = 32;

/// What a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The answer to the server's nonce: which token (its SHA-256), and
    /// HMAC-SHA256(token, nonce).
    Hello {
        /// SHA-256 of the mesh token.
        token_id: [u8; MAC_LEN],
        /// HMAC-SHA256(token, nonce).
        mac: [u8; MAC_LEN],
    },
    /// Send `len` bytes of buffer `id` from `offset`.
    Read {
        /// Registration id.
        id: u64,
        /// Byte offset within the buffer.
        offset: u64,
        /// Bytes wanted.
        len: u64,
    },
    /// The next `len` raw bytes go into buffer `id` at `offset`.
    Write {
        /// Registration id.
        id: u64,
        /// Byte offset within the buffer.
        offset: u64,
        /// Bytes that follow.
        len: u64,
    },
    /// One reader is done with buffer `id` (answered: it was still registered).
    Release {
        /// Registration id.
        id: u64,
    },
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is above [`MAX_FRAME`] (or zero).
    #[error("frame length {0} is out of range (1..={MAX_FRAME})")]
    BadLength(usize),
    /// The body is shorter or longer than its kind needs.
    #[error("frame of kind {kind} has {got} bytes, needs {want}")]
    WrongSize {
        /// The kind byte.
        kind: u8,
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// An unknown kind byte.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
}

const HELLO: u8 = 1;
const READ: u8 = 2;
const WRITE: u8 = 3;
const RELEASE: u8 = 4;

/// Checks a length prefix before the body is read.
pub fn check_len(len: u32) -> Result<usize, FrameError> {
    let len = len as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(FrameError::BadLength(len));
    }
    Ok(len)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Decodes one frame body (the bytes after the length prefix). Never panics and
/// never allocates more than the body it is given.
pub fn decode(body: &[u8]) -> Result<Request, FrameError> {
    let Some((&kind, rest)) = body.split_first() else {
        return Err(FrameError::BadLength(0));
    };
    let need = |want: usize| {
        if rest.len() == want {
            Ok(())
        } else {
            Err(FrameError::WrongSize {
                kind,
                got: rest.len(),
                want,
            })
        }
    };
    match kind {
        HELLO => {
            need(2 * MAC_LEN)?;
            let mut token_id = [0u8; MAC_LEN];
            let mut mac = [0u8; MAC_LEN];
            token_id.copy_from_slice(&rest[..MAC_LEN]);
            mac.copy_from_slice(&rest[MAC_LEN..]);
            Ok(Request::Hello { token_id, mac })
        }
        READ | WRITE => {
            need(24)?;
            let (id, offset, len) = (u64_at(rest, 0), u64_at(rest, 8), u64_at(rest, 16));
            Ok(if kind == READ {
                Request::Read { id, offset, len }
            } else {
                Request::Write { id, offset, len }
            })
        }
        RELEASE => {
            need(8)?;
            Ok(Request::Release {
                id: u64_at(rest, 0),
            })
        }
        k => Err(FrameError::UnknownKind(k)),
    }
}

/// Encodes a frame, length prefix included.
pub fn encode(req: &Request) -> Vec<u8> {
    let mut body = Vec::with_capacity(65);
    match req {
        Request::Hello { token_id, mac } => {
            body.push(HELLO);
            body.extend_from_slice(token_id);
            body.extend_from_slice(mac);
        }
        Request::Read { id, offset, len } | Request::Write { id, offset, len } => {
            body.push(if matches!(req, Request::Read { .. }) {
                READ
            } else {
                WRITE
            });
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&len.to_le_bytes());
        }
        Request::Release { id } => {
            body.push(RELEASE);
            body.extend_from_slice(&id.to_le_bytes());
        }
    }
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The answer to a request: a status byte and a length (of the data that follows
/// an OK `Read`, or of the UTF-8 message that follows an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Done; for `Read`, `len` bytes follow.
    Ok = 0,
    /// No such registration (never was, released, or expired).
    Unknown = 1,
    /// Offset and length fall outside the buffer.
    OutOfRange = 2,
    /// The handshake failed, or the registration belongs to another mesh.
    Denied = 3,
    /// The frame was malformed.
    Malformed = 4,
}

impl Status {
    /// From the wire.
    pub fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::Unknown,
            2 => Status::OutOfRange,
            3 => Status::Denied,
            4 => Status::Malformed,
            _ => return None,
        })
    }
}

/// A status header: 1 byte, then a little-endian u64.
pub fn status_header(status: Status, len: u64) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[0] = status as u8;
    h[1..].copy_from_slice(&len.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_request_round_trips() {
        let reqs = [
            Request::Hello {
                token_id: [7; 32],
                mac: [9; 32],
            },
            Request::Read {
                id: 1,
                offset: 2,
                len: 3,
            },
            Request::Write {
                id: u64::MAX,
                offset: 0,
                len: 1 << 40,
            },
            Request::Release { id: 42 },
        ];
        for r in reqs {
            let wire = encode(&r);
            let len = u32::from_le_bytes(wire[..4].try_into().unwrap());
            assert_eq!(check_len(len).unwrap(), wire.len() - 4);
            assert_eq!(decode(&wire[4..]).unwrap(), r);
        }
    }

    #[test]
    fn lengths_out_of_range_are_refused_before_reading() {
        assert!(check_len(0).is_err());
        assert!(check_len(MAX_FRAME as u32 + 1).is_err());
        assert!(check_len(u32::MAX).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        // XFER-3: any bytes decode to a request or an error, never a panic.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&body);
        }

        // A valid frame with any byte changed or cut short is still handled.
        #[test]
        fn mutated_frames_never_panic(id in any::<u64>(), off in any::<u64>(), len in any::<u64>(),
                                      at in 0usize..25, byte in any::<u8>(), cut in 0usize..26) {
            let mut wire = encode(&Request::Read { id, offset: off, len });
            let body = &mut wire[4..];
            body[at] = byte;
            let _ = decode(&body[..cut.min(body.len())]);
        }
    }
}
