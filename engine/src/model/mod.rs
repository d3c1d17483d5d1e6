//! Model families and the forward over a `KvCellCache`.
