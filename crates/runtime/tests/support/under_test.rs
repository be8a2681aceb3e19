//! A `TestRuntime` on a backend: a fresh database of its own (a temporary SQLite file,
//! or a database on the test binary's throwaway PostgreSQL server).

use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::RuntimeBuilder;
use agentsaga_runtime::testing::TestRuntime;

/// `builder` under test on a fresh database of `backend`.
pub(crate) async fn start(backend: Backend, builder: RuntimeBuilder) -> TestRuntime {
    TestRuntime::start_on(&fresh_url(backend).await, builder)
        .await
        .unwrap()
}
