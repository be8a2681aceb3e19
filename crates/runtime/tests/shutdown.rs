//! A shutdown stops the actors on purpose: none is reported dead or restarted. (The
//! supervisor used to learn that the stop was on purpose only after some child had
//! stopped, and logged "actor died; restarting it" for it, now and then: a newcomer's
//! first run of the example showed that ERROR line.) Alone in its binary: it reads
//! what every thread logs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga_core::testing::{backends, fresh_url};
use agentsaga_runtime::Runtime;
use agentsaga_saga::{Saga, SagaState, Step};
use serde_json::{Value, json};

#[path = "support/echo.rs"]
mod echo;
use echo::Echo;

/// What the process's tracing wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_kills_no_actor() {
    let logs = Captured::default();
    tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::ERROR)
        .init();
    for _ in 0..50 {
        let saga = Saga::<Value>::builder("order", 1)
            .step(Step::new("a", "a").compensate("a", |_: &Value| json!("undo")))
            .step(Step::new("b", "b").compensate("b", |_: &Value| json!("undo")))
            .build()
            .unwrap();
        let mut builder = Runtime::builder()
            .database(fresh_url(backends()[0]).await)
            .saga(saga);
        for d in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            builder = builder.agent(Echo(d));
        }
        let rt = builder.start().await.unwrap();
        let id = rt.start_saga("order", &json!({})).await.unwrap();
        let state = tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
            .await
            .expect("settles")
            .unwrap();
        assert_eq!(state, SagaState::Completed);
        rt.shutdown().await;
    }
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    assert!(!text.contains("actor died"), "{text}");
}
