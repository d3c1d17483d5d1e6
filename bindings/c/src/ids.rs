//! Sequence ids cross the ABI as `uint64_t`, whatever width the core's
//! `SeqId` alias has; these two helpers are the only conversions.

use offgraph_kv::SeqId;

use crate::status::{fail, okv_status, R};

/// An id from C; one that cannot be a `SeqId` was never handed out.
#[allow(clippy::useless_conversion, clippy::unnecessary_fallible_conversions)]
pub(crate) fn from_c(id: u64, what: &str) -> R<SeqId> {
    SeqId::try_from(id).map_err(|_| {
        fail(
            okv_status::OKV_ERR_UNKNOWN_SEQUENCE,
            format!("{what}: sequence id {id} is not live (not handed out by this cache)"),
        )
    })
}

#[allow(clippy::useless_conversion)]
pub(crate) fn to_c(id: SeqId) -> u64 {
    u64::from(id)
}
