//! A runtime given no database opens the default one: a SQLite file in the working
//! directory. (Its own test binary: it changes the process's working directory.)

// The default database is a SQLite file.
#![cfg(feature = "sqlite")]

use agentsaga_runtime::{AgentContext, DEFAULT_DATABASE, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step};

struct Echo;

#[async_trait::async_trait]
impl agentsaga_runtime::Agent for Echo {
    type Command = serde_json::Value;
    type Reply = serde_json::Value;
    fn destination(&self) -> &str {
        "echo"
    }
    async fn handle(
        &self,
        _: &mut AgentContext<'_>,
        cmd: serde_json::Value,
    ) -> Result<serde_json::Value, StepError> {
        Ok(cmd)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_database_means_a_sqlite_file_here() {
    assert_eq!(DEFAULT_DATABASE, "sqlite://agentsaga.db");
    let dir = std::env::temp_dir().join(format!("agentsaga-default-db-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_current_dir(&dir).unwrap();
    let saga = Saga::<serde_json::Value>::builder("echo", 1)
        .step(Step::new("echo", "echo").nothing_to_undo())
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .agent(Echo)
        .saga(saga)
        .start()
        .await
        .unwrap();
    assert_eq!(rt.store().backend(), "sqlite");
    let id = rt.start_saga("echo", &serde_json::json!(1)).await.unwrap();
    assert_eq!(rt.wait(id).await.unwrap(), SagaState::Completed);
    rt.shutdown().await;
    assert!(dir.join("agentsaga.db").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
