//! Token authentication of every gRPC call (docs/architecture.md, "Security").
//!
//! AUTH-1: a server never runs a handler (so never reaches an unpickler) for a call
//! whose `authorization` metadata is not exactly `Bearer <mesh token>`; the compare is
//! constant-time. AUTH-2: an empty token is refused at construction, never "no auth".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The metadata key that carries the token.
pub const HEADER: &str = "authorization";

/// Why a token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// AUTH-2.
    #[error("the mesh token is empty; a mesh always has a secret token (its state file has it)")]
    Empty,
    /// Only printable ASCII can travel in gRPC metadata.
    #[error("the mesh token must be printable ASCII")]
    NotAscii,
}

/// The value a client presents: `Bearer <token>`.
pub(crate) fn bearer(token: &str) -> Result<String, TokenError> {
    if token.is_empty() {
        return Err(TokenError::Empty);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::NotAscii);
    }
    Ok(format!("Bearer {token}"))
}

/// Server side: rejects calls without the right token.
#[derive(Clone)]
pub struct TokenCheck {
    expected: Arc<[u8]>,
    /// Counts rejected calls, reported by `Stats`.
    rejected: Arc<AtomicU64>,
}

impl TokenCheck {
    /// A check for `token`.
    pub fn new(token: &str) -> Result<Self, TokenError> {
        Ok(TokenCheck {
            expected: bearer(token)?.into_bytes().into(),
            rejected: Arc::new(AtomicU64::new(0)),
        })
    }

    /// How many calls were rejected so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// True if `presented` is exactly the expected header value (constant time).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        presented.ct_eq(&self.expected).into()
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let ok = req
            .metadata()
            .get(HEADER)
            .map(|v| self.accepts(v.as_bytes()))
            .unwrap_or(false);
        if ok {
            Ok(req)
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            Err(Status::unauthenticated(
                "missing or wrong mesh token; reach the mesh through the ProcMesh or \
                 ActorMesh that spawned it instead of dialling its address directly",
            ))
        }
    }
}

/// Client side: adds the token to every call.
#[derive(Clone)]
pub struct TokenAttach {
    header: MetadataValue<Ascii>,
}

impl TokenAttach {
    /// Attaches `token`.
    pub fn new(token: &str) -> Result<Self, TokenError> {
        let header = bearer(token)?.parse().map_err(|_| TokenError::NotAscii)?;
        Ok(TokenAttach { header })
    }
}

impl Interceptor for TokenAttach {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(HEADER, self.header.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_token_is_refused() {
        assert!(matches!(TokenCheck::new(""), Err(TokenError::Empty)));
        assert!(matches!(TokenAttach::new(""), Err(TokenError::Empty)));
    }

    #[test]
    fn check_accepts_only_the_exact_bearer_value() {
        let c = TokenCheck::new("s3cret").unwrap();
        assert!(c.accepts(b"Bearer s3cret"));
        assert!(!c.accepts(b"Bearer s3cre"));
        assert!(!c.accepts(b"Bearer s3cret2"));
        assert!(!c.accepts(b"s3cret"));
        assert!(!c.accepts(b""));
    }

    #[test]
    fn interceptor_counts_rejections() {
        let mut c = TokenCheck::new("tok").unwrap();
        assert!(c.call(Request::new(())).is_err());
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(HEADER, "Bearer tok".parse().unwrap());
        assert!(c.call(req).is_ok());
        assert_eq!(c.rejected(), 1);
    }
}
