//! Locks that outlive a panic.
//!
//! A panic while a lock is held (a bug in one request) poisons it; the data behind every lock
//! of this crate stays consistent between statements (caches, counters, indexes), so the next
//! user takes the lock as it is rather than failing every later request too.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mutex`, locked, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// `lock`, read-locked, poisoned or not.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// `lock`, write-locked, poisoned or not.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}
