//! Native core of monarch-kernel: one tokio runtime per process ([`node`]), the gRPC
//! control plane ([`rpc`]: the `Worker` service and its one client), the data plane
//! ([`transfer`]: buffers pulled straight into the receiver's memory), and the host
//! agent that owns worker processes ([`agent`]).
//!
//! This file only wires modules. pyo3 appears only in `py/` (feature `python`), so
//! `cargo test` builds and runs without libpython.
#![warn(missing_docs)]

pub mod agent;
mod ids;
pub mod node;
pub mod proto;
pub mod rpc;
mod sync;
pub mod transfer;

#[cfg(feature = "python")]
mod py;
