//! TensorFS: model checkpoints stored once in a content-addressed chunk store and shown as
//! ordinary Diffusers and Transformers folders through FUSE.
#![deny(missing_docs)]

pub mod cli;
pub mod decode;
pub mod encode;
pub mod extents;
pub mod format;
pub mod fs;
pub mod fuse;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod import;
pub mod io;
pub mod layout;
pub mod lazy;
pub mod quantize;
pub mod remote;
pub mod revisions;
pub mod store;
mod sync;
pub mod views;
