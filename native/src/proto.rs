//! Code generated from `proto/monarch_kernel/v1/*.proto` (the control-plane contract).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Version 1 of the contract.
pub mod v1 {
    tonic::include_proto!("monarch_kernel.v1");
}
