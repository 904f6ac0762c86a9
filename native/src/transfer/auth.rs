//! Who may talk to an engine (XFER-3). A mesh is named by the SHA-256 of its token
//! ([`token_id`]); the server sends every new connection a fresh random nonce
//! ([`nonce`]) and the client answers with HMAC-SHA256(token, nonce) ([`hello`]),
//! which the server checks in constant time ([`verify`]). The token itself never
//! travels, and a recorded answer does not fit the next nonce.
//!
//! Without a random source there is no handshake: [`nonce`] fails rather than
//! return a predictable value (a nonce that repeats makes a recorded handshake
//! good again), and the server then refuses the connection, saying why.

use super::frame::{Request, MAC_LEN};
use super::XferError;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::Read;

type HmacSha256 = Hmac<Sha256>;

/// SHA-256 of a token: how registrations and handshakes name a mesh.
pub fn token_id(token: &[u8]) -> [u8; MAC_LEN] {
    Sha256::digest(token).into()
}

fn mac(token: &[u8], nonce: &[u8]) -> [u8; MAC_LEN] {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes any key length");
    m.update(nonce);
    m.finalize().into_bytes().into()
}

/// What a client answers to the server's `nonce`: it proves it knows `token`.
pub(super) fn hello(token: &[u8], nonce: &[u8; MAC_LEN]) -> Request {
    Request::Hello {
        token_id: token_id(token),
        mac: mac(token, nonce),
    }
}

/// True if `m` is the MAC of `nonce` under `token` (compared in constant time).
pub(super) fn verify(token: &[u8], nonce: &[u8; MAC_LEN], m: &[u8; MAC_LEN]) -> bool {
    use subtle::ConstantTimeEq;
    mac(token, nonce).ct_eq(m).into()
}

/// Where nonces come from.
const RANDOM_SOURCE: &str = "/dev/urandom";

/// A fresh random nonce for one handshake, or why there is none (never a
/// predictable one).
pub(super) fn nonce() -> Result<[u8; MAC_LEN], XferError> {
    let src = std::fs::File::open(RANDOM_SOURCE).map_err(no_nonce)?;
    nonce_from(src)
}

/// A nonce read from `src`; a failed or short read is an error.
fn nonce_from(mut src: impl Read) -> Result<[u8; MAC_LEN], XferError> {
    let mut n = [0u8; MAC_LEN];
    src.read_exact(&mut n).map_err(no_nonce)?;
    Ok(n)
}

fn no_nonce(e: std::io::Error) -> XferError {
    XferError::NoNonce(format!("cannot read {RANDOM_SOURCE}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Broken;

    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("device gone"))
        }
    }

    #[test]
    fn a_random_source_that_cannot_be_read_gives_an_error_not_zeros() {
        let err = nonce_from(Broken).unwrap_err();
        assert!(matches!(err, XferError::NoNonce(_)), "{err:?}");
        assert!(err.to_string().contains("device gone"), "{err}");
        let short: &[u8] = &[7; MAC_LEN - 1];
        assert!(nonce_from(short).is_err(), "a short read is not a nonce");
        let full: &[u8] = &[7; MAC_LEN + 3];
        assert_eq!(nonce_from(full).unwrap(), [7; MAC_LEN]);
    }

    #[test]
    fn nonces_are_fresh_and_a_mac_checks_only_against_its_own() {
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b);
        let Request::Hello { token_id: tid, mac } = hello(b"tok", &a) else {
            unreachable!("hello is a Hello")
        };
        assert_eq!(tid, token_id(b"tok"));
        assert!(verify(b"tok", &a, &mac));
        assert!(
            !verify(b"tok", &b, &mac),
            "a recorded answer does not fit a new nonce"
        );
        assert!(!verify(b"other", &a, &mac));
    }
}
