//! A saga run to its end, and its error.

// Not every test binary including this file reads errors.
#![allow(dead_code)]

use std::time::Duration;

use agentsaga_runtime::Runtime;
use agentsaga_saga::{SagaId, SagaState, query};

/// Waits (30 s at most) until saga `id` settles; its state.
pub(crate) async fn settle(rt: &Runtime, id: SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .expect("the saga settles")
        .unwrap()
}

/// Saga `id`'s error contains `needle`.
pub(crate) async fn assert_error_contains(rt: &Runtime, id: SagaId, needle: &str) {
    let saga = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(
        saga.error.as_deref().unwrap_or_default().contains(needle),
        "{saga:?}"
    );
}
