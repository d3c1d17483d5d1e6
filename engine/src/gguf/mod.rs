//! GGUF files: the header, metadata and tensor table, parsed with every
//! offset, size and count checked against the file before it is used.

mod file;
mod header;
mod meta;
mod reader;
mod value;

pub use file::{GgufFile, Tensor};
pub use header::{parse_header, Header, TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
pub use meta::MAX_ARRAY_DEPTH;
pub use value::{Metadata, Value};
