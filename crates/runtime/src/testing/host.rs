//! The tokio runtime a test runtime runs on, dropped at a crash.

use crate::{Error, Result, Runtime, RuntimeBuilder};

thread_local! {
    /// A host thread's hold on its test runtime's subscriber, as its default.
    static TRACING: std::cell::RefCell<Option<tracing::dispatcher::DefaultGuard>> =
        const { std::cell::RefCell::new(None) };
}

/// The tokio runtime a `TestRuntime`'s runtime runs on (two worker threads, as a
/// small production box): every task the runtime spawns (actors, relay, lane,
/// timers) is on it, so that dropping it stops them all at once, where they stand,
/// as a `kill -9` stops a process.
pub(crate) struct Host(Option<tokio::runtime::Runtime>);

impl Host {
    /// A host whose threads trace through `dispatch`.
    pub(super) fn new(dispatch: &tracing::Dispatch) -> Result<Self> {
        let dispatch = dispatch.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("agentsaga-test")
            .on_thread_start(move || {
                let guard = tracing::dispatcher::set_default(&dispatch);
                let _ = TRACING.try_with(|g| *g.borrow_mut() = Some(guard));
            })
            // Let go of the subscriber while the thread still runs: dropped in its
            // thread-local's destructor (the last hold on it, once the test runtime is
            // gone), its exporter's shutdown would abort the process.
            .on_thread_stop(|| {
                let _ = TRACING.try_with(|g| g.borrow_mut().take());
            })
            .enable_all()
            .build()
            .map(|rt| Self(Some(rt)))
            .map_err(|e| Error::Spawn(format!("the test's tokio runtime: {e}")))
    }

    /// Starts `builder` on this host.
    pub(super) async fn start(&self, builder: RuntimeBuilder) -> Result<Runtime> {
        let Some(rt) = &self.0 else {
            return Err(Error::Spawn("the test's tokio runtime is gone".into()));
        };
        rt.spawn(builder.start())
            .await
            .map_err(|e| Error::Spawn(format!("the runtime's start did not finish: {e}")))?
    }

    /// Stops every task on this host where it stands, without waiting for any.
    pub(super) fn kill(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}
