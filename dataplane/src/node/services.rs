//! The node's background services, each a task: started in one place ([`super::start`]) and
//! stopped in one place ([`Services::stop`]), so that nothing of the node outlives its stop
//! but what a restart hands over on disk.

use std::future::Future;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub struct Services {
    /// Turns true once, at the stop: what a task must finish (a last record) it finishes then.
    stopping: watch::Sender<bool>,
    /// Tasks that end on their own once told to stop; awaited.
    told: JoinSet<()>,
    /// Tasks with nothing to finish; cut off at the stop.
    cut: JoinSet<()>,
}

impl Services {
    pub fn new() -> Services {
        Services {
            stopping: watch::channel(false).0,
            told: JoinSet::new(),
            cut: JoinSet::new(),
        }
    }

    /// A service with nothing to finish when the node stops: it is cut off then.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.cut.spawn(task);
    }

    /// A service that finishes something when the node stops: `task` gets the stop signal
    /// (true once the node stops) and must end soon after it.
    pub fn spawn_stopped_by<F>(&mut self, task: impl FnOnce(watch::Receiver<bool>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.told.spawn(task(self.stopping.subscribe()));
    }

    /// Tells every service to stop, waits for those that finish something, and cuts off the
    /// rest.
    pub async fn stop(mut self) {
        let _ = self.stopping.send(true);
        while self.told.join_next().await.is_some() {}
        self.cut.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Sets its flag when dropped: a task cut off drops what it holds.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_stop_waits_for_what_services_finish_and_cuts_off_the_rest() {
        let mut services = Services::new();
        let finished = Arc::new(AtomicBool::new(false));
        let told = finished.clone();
        services.spawn_stopped_by(|mut stopping| async move {
            let _ = stopping.wait_for(|stopping| *stopping).await;
            // Something to finish after the signal: the stop waits for it.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            told.store(true, Ordering::SeqCst);
        });
        let cut = Arc::new(AtomicBool::new(false));
        let held = Dropped(cut.clone());
        services.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await
        });
        services.stop().await;
        assert!(finished.load(Ordering::SeqCst), "the told service finished");
        assert!(cut.load(Ordering::SeqCst), "the other one was cut off");
    }
}
