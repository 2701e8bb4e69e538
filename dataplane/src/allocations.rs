//! Counting allocations, for the bench only (`--features count-allocations`): the global
//! allocator counts every allocation and reallocation, and the node prints the count on
//! stdout (`allocations N`) each time it gets SIGUSR1, so the bench can read the count before
//! and after a run and divide by the messages. Never in a production build: the count costs
//! an atomic add per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Prints `allocations N` on stdout at every SIGUSR1, for as long as the node runs.
pub fn report_on_signal() {
    tokio::spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut signals) = signal(SignalKind::user_defined1()) else {
            return;
        };
        while signals.recv().await.is_some() {
            println!("allocations {}", ALLOCATIONS.load(Ordering::Relaxed));
        }
    });
}
