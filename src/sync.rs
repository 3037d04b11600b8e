//! Locks that outlive a panic, and the thread pool across `fork()`.
//!
//! A panic while a lock is held (a bug in one request) poisons it; the data behind every lock
//! of this crate stays consistent between statements (caches, counters, indexes), so the next
//! user takes the lock as it is rather than failing every later request too.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The process whose work first went to rayon's global thread pool (0: none yet).
static POOL_OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether work may go to rayon's global thread pool in this process. A process forked after
/// the pool started (a Python loader's worker, forked from a process that read with it) has a
/// copy of the pool without its threads, and work sent there would wait forever: such a
/// process does the work on its own thread instead. Every use of the pool asks first, so the
/// first asker is the process that starts it.
pub(crate) fn pool_usable() -> bool {
    let me = std::process::id();
    match POOL_OWNER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(owner) => owner == me,
    }
}

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

/// `f` in a forked child: its exit status (0 when `f` says true). The child calls nothing but
/// `f` and `_exit`, so `f` must only use what survives a fork of a threaded process (atomics,
/// system calls).
#[cfg(test)]
pub(crate) fn in_forked_child(f: impl FnOnce() -> bool) -> i32 {
    // SAFETY: the child runs `f` and exits without unwinding or running destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = if f() { 0 } else { 1 };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    libc::WEXITSTATUS(status)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forked_child_does_not_use_the_pool_its_parent_started() {
        assert!(
            super::pool_usable(),
            "the first process to ask owns the pool"
        );
        let code = super::in_forked_child(|| !super::pool_usable());
        assert_eq!(code, 0, "the child was told to use its parent's pool");
        assert!(super::pool_usable());
    }
}
