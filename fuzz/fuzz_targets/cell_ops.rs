//! Arbitrary bytes -> operation sequences on `KvCellCache` / `CellCache`,
//! checked against the DESIGN.md invariants after every operation. The
//! decoder and checker live in `tests/fuzz_cell/mod.rs`, shared with the
//! stable replay test `tests/fuzz_replay.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_cell/mod.rs"]
mod fuzz_cell;

fuzz_target!(|data: &[u8]| {
    fuzz_cell::run(data);
});
