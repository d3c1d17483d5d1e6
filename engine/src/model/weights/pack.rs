//! Packing the weights at open on several threads. A job is one tensor (a
//! fused tensor's parts together, so its file pages go once all of them are
//! packed); workers take the largest job left, so the last few jobs are
//! small. Each part writes only its own range of the packed mapping, so the
//! bytes are the same for any number of threads.

use super::MatRef;
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::quant;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One tensor's parts and each part's range of the packed mapping (empty
/// when the part is not packed).
pub(super) struct Job<'a> {
    parts: Vec<(&'a MatRef, &'a mut [u8])>,
}

impl Job<'_> {
    fn bytes(&self) -> usize {
        self.parts.iter().map(|(_, out)| out.len()).sum()
    }
}

/// Splits `out` (the packed mapping from its first matrix on) into the
/// matrices' ranges (`at`: offset and length of each, in order) and groups
/// consecutive parts of one tensor into a job; smallest job first.
pub(super) fn jobs<'a>(
    mats: &[&'a MatRef],
    at: &[(usize, usize)],
    mut out: &'a mut [u8],
) -> Result<Vec<Job<'a>>> {
    let range = || EngineError::Model("packed weights: out of range".into());
    let mut jobs: Vec<Job<'a>> = Vec::new();
    let mut pos = 0;
    for (&m, &(off, len)) in mats.iter().zip(at) {
        let skip = off.checked_sub(pos).ok_or_else(range)?;
        let rest = std::mem::take(&mut out);
        let (_, rest) = rest.split_at_mut_checked(skip).ok_or_else(range)?;
        let (mine, rest) = rest.split_at_mut_checked(len).ok_or_else(range)?;
        out = rest;
        pos = off + len;
        match jobs.last_mut() {
            Some(j) if j.parts.first().is_some_and(|(p, _)| p.name == m.name) => {
                j.parts.push((m, mine))
            }
            _ => jobs.push(Job {
                parts: vec![(m, mine)],
            }),
        }
    }
    jobs.sort_by_key(Job::bytes);
    Ok(jobs)
}

/// Packs every job on `threads` threads (this one among them): the first
/// error stops the others and is returned.
pub(super) fn run(file: &GgufFile, jobs: Vec<Job<'_>>, threads: usize) -> Result<()> {
    let queue = Mutex::new(jobs);
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<EngineError>> = Mutex::new(None);
    let work = || {
        while !failed.load(Ordering::Relaxed) {
            // The queue holds no invariant a panicked holder could break.
            let job = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let Some(job) = job else { break };
            if let Err(e) = pack_job(file, job) {
                failed.store(true, Ordering::Relaxed);
                first_err
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
        }
    };
    std::thread::scope(|s| {
        for i in 1..threads.max(1) {
            // A thread the OS refuses leaves its share to the others.
            let _ = std::thread::Builder::new()
                .name(format!("okv-pack-{i}"))
                .spawn_scoped(s, work);
        }
        work();
    });
    match first_err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Packs one tensor's parts, then drops its file pages if any part was packed.
fn pack_job(file: &GgufFile, job: Job<'_>) -> Result<()> {
    let mut packed_any = false;
    let mut name = "";
    for (m, out) in job.parts {
        name = &m.name;
        if !out.is_empty() {
            quant::pack(&super::Weights::matrix(file, m)?, out)
                .map_err(|e| EngineError::Model(format!("tensor {:?}: {e}", m.name)))?;
            packed_any = true;
        }
    }
    if packed_any {
        file.release_tensor(name);
    }
    Ok(())
}
