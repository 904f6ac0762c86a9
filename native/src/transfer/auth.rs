//! Who may talk to an engine (XFER-3). A mesh is named by the SHA-256 of its token
//! ([`token_id`]); the server sends every new connection a fresh random nonce
//! ([`nonce`]) and the client answers with HMAC-SHA256(token, nonce) ([`hello`]),
//! which the server checks in constant time ([`verify`]). The token itself never
//! travels, and a recorded answer does not fit the next nonce.

use super::frame::{Request, MAC_LEN};
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

/// A fresh random nonce for one handshake.
pub(super) fn nonce() -> [u8; MAC_LEN] {
    let mut n = [0u8; MAC_LEN];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut n);
    }
    n
}
