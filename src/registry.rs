//! A key-addressed registry of caches, a builder table keyed by
//! `(backend_id, kind)`, and a session that installs on creation and erases
//! when dropped.
//!
//! The registry is generic over what it stores so the Python bindings can keep
//! Python objects in one of their own; [`global`] is the process-wide instance
//! for Rust callers. Every method takes `&self` and is thread-safe.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::config::CacheConfig;
use crate::error::{CacheError, Result};

/// What the global registry stores: any cache, shared. Callers downcast with
/// `Arc::downcast` (e.g. to `Mutex<SequenceCache>`).
pub type AnyCache = Arc<dyn Any + Send + Sync>;

/// A builder: makes a cache from a validated config.
pub type Builder<T> = Arc<dyn Fn(&CacheConfig) -> Result<T> + Send + Sync>;

/// A thread-safe map from key to cache.
pub struct Registry<T> {
    /// Each cache with the serial of its installation: what a session checks
    /// before it erases (the key may hold someone else's cache by then).
    caches: Mutex<HashMap<String, (u64, T)>>,
    builders: Mutex<HashMap<(String, String), Builder<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            caches: Mutex::new(HashMap::new()),
            builders: Mutex::new(HashMap::new()),
        }
    }
}

/// A poisoned lock only means another thread panicked while holding it; the
/// maps stay consistent (every mutation is a single insert/remove), so go on.
fn lock<M>(m: &Mutex<M>) -> MutexGuard<'_, M> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static KEY_COUNTER: AtomicU64 = AtomicU64::new(0);
static INSTALL_SERIAL: AtomicU64 = AtomicU64::new(0);

impl<T: Clone> Registry<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `cache` under `key`; a taken key is refused and nothing changes.
    pub fn install(&self, key: &str, cache: T) -> Result<()> {
        self.install_serial(key, cache).map(|_| ())
    }

    /// [`Self::install`], returning a serial no other installation in this
    /// process gets: [`Self::erase_installed`] erases only that installation.
    pub fn install_serial(&self, key: &str, cache: T) -> Result<u64> {
        if key.is_empty() {
            return Err(CacheError::InvalidArgument(
                "install: the key must not be empty".to_string(),
            ));
        }
        let mut map = lock(&self.caches);
        if map.contains_key(key) {
            return Err(CacheError::KeyExists(format!(
                "install: key {key:?} is already taken"
            )));
        }
        let serial = INSTALL_SERIAL.fetch_add(1, Ordering::Relaxed);
        map.insert(key.to_string(), (serial, cache));
        Ok(serial)
    }

    /// Erases `key` only while it still holds the installation `serial`
    /// (atomic under the lock). Returns whether it erased.
    pub fn erase_installed(&self, key: &str, serial: u64) -> bool {
        let mut map = lock(&self.caches);
        match map.get(key) {
            Some((s, _)) if *s == serial => map.remove(key).is_some(),
            _ => false,
        }
    }

    pub fn get(&self, key: &str) -> Result<T> {
        lock(&self.caches)
            .get(key)
            .map(|(_, c)| c.clone())
            .ok_or_else(|| CacheError::NotFound(format!("get: no cache under key {key:?}")))
    }

    /// Removes and returns the cache under `key`.
    pub fn erase(&self, key: &str) -> Result<T> {
        lock(&self.caches)
            .remove(key)
            .map(|(_, c)| c)
            .ok_or_else(|| CacheError::NotFound(format!("erase: no cache under key {key:?}")))
    }

    /// Removes the cache under `key` only if `is_it` accepts it, in one step
    /// under the lock (a check-then-erase could remove a cache someone else
    /// installed in between). Returns whether it removed one.
    pub fn erase_if(&self, key: &str, is_it: impl FnOnce(&T) -> bool) -> bool {
        let mut map = lock(&self.caches);
        match map.get(key) {
            Some((_, c)) if is_it(c) => map.remove(key).is_some(),
            _ => false,
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        lock(&self.caches).contains_key(key)
    }

    pub fn len(&self) -> usize {
        lock(&self.caches).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = lock(&self.caches).keys().cloned().collect();
        k.sort();
        k
    }

    /// A key no other call in this process has returned: `prefix` plus a
    /// process-wide counter, skipping any key already installed by hand.
    pub fn unique_key(&self, prefix: &str) -> String {
        loop {
            let n = KEY_COUNTER.fetch_add(1, Ordering::Relaxed);
            let key = format!("{prefix}{n}");
            if !self.contains(&key) {
                return key;
            }
        }
    }

    /// Registers (or replaces) the builder for `(backend_id, kind)`.
    pub fn register_builder(&self, backend_id: &str, kind: &str, builder: Builder<T>) {
        lock(&self.builders).insert((backend_id.to_string(), kind.to_string()), builder);
    }

    pub fn has_builder(&self, backend_id: &str, kind: &str) -> bool {
        lock(&self.builders).contains_key(&(backend_id.to_string(), kind.to_string()))
    }

    /// Validates `cfg`, then builds with the builder for `(backend_id, kind)`.
    pub fn build(&self, backend_id: &str, kind: &str, cfg: &CacheConfig) -> Result<T> {
        cfg.validate()?;
        // Clone the builder out so it runs without the lock held (it may use the registry).
        let builder = lock(&self.builders)
            .get(&(backend_id.to_string(), kind.to_string()))
            .cloned()
            .ok_or_else(|| {
                CacheError::NotFound(format!(
                    "build: no builder for backend {backend_id:?}, kind {kind:?}"
                ))
            })?;
        builder(cfg)
    }
}

/// The process-wide registry for Rust callers.
pub fn global() -> &'static Registry<AnyCache> {
    static GLOBAL: OnceLock<Registry<AnyCache>> = OnceLock::new();
    GLOBAL.get_or_init(Registry::new)
}

/// Installs a cache on creation and erases its key when dropped.
pub struct CacheSession<'r, T: Clone> {
    registry: &'r Registry<T>,
    key: String,
    serial: u64,
    cache: T,
}

impl<'r, T: Clone> CacheSession<'r, T> {
    /// Installs `cache` under `key`, or under a fresh `unique_key("session-")` when `None`.
    pub fn new(registry: &'r Registry<T>, cache: T, key: Option<&str>) -> Result<Self> {
        let key = match key {
            Some(k) => k.to_string(),
            None => registry.unique_key("session-"),
        };
        let serial = registry.install_serial(&key, cache.clone())?;
        Ok(CacheSession {
            registry,
            key,
            serial,
            cache,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn cache(&self) -> &T {
        &self.cache
    }
}

impl<T: Clone> Drop for CacheSession<'_, T> {
    fn drop(&mut self) {
        // Only the session's own installation: the key may have been erased by
        // hand and taken by someone else's cache since.
        self.registry.erase_installed(&self.key, self.serial);
    }
}
