//! GGUF files: the header, metadata and tensor table, parsed with every
//! offset, size and count checked against the file before it is used.

mod value;

pub use value::{Metadata, Value};
