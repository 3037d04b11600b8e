//! TensorFS: model checkpoints stored once in a content-addressed chunk store and shown as
//! ordinary Diffusers and Transformers folders through FUSE.
#![deny(missing_docs)]

pub mod format;
pub mod store;
pub mod layout;
pub mod io;
