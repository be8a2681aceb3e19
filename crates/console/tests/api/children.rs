//! Child sagas as operators see them: a parent's show document and page list its
//! children, a child's names its parent, `GET /api/v1/sagas?parent=ID` lists them.

use std::time::Duration;

use agentsaga_console::Console;
use agentsaga_console::http::HttpConfig;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaId, SagaState, Step};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::server::*;

struct Echo(&'static str);

#[async_trait::async_trait]
impl Agent for Echo {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        self.0
    }
    async fn handle(&self, _: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        Ok(cmd)
    }
}

pub(crate) async fn a_parent_shows_its_children(backend: Backend) {
    let child = Saga::<Value>::builder("booking", 1)
        .step(Step::new("flight", "flights").compensate("flights", |_: &Value| "cancel"))
        .build()
        .unwrap();
    let parent = Saga::<Value>::builder("travel", 1)
        .step(Step::saga("book", "booking"))
        .build()
        .unwrap();
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Echo("flights"))
        .saga(child)
        .saga(parent)
        .start()
        .await
        .unwrap();
    let id = rt
        .start_saga("travel", &json!({"who": "ed"}))
        .await
        .unwrap();
    let state = tokio::time::timeout(Duration::from_secs(30), rt.wait(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state, SagaState::Completed);
    let console = Console::new(rt.store().clone());
    let api = Api::console(&console, HttpConfig::default()).await;

    let page = api.ok(&format!("/api/v1/sagas?parent={id}")).await;
    let children = page["sagas"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{page}");
    assert_eq!(children[0]["name"], "booking");
    assert_eq!(children[0]["parent_id"], id.to_string());
    let child: SagaId = children[0]["id"].as_str().unwrap().parse().unwrap();
    let shown = api.ok(&format!("/api/v1/sagas/{id}")).await;
    assert_eq!(shown["children"], page["sagas"], "{shown}");
    assert_eq!(shown["saga"]["parent_id"], Value::Null);
    let (status, bad) = api.get("/api/v1/sagas?parent=nope").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");

    let html = |path: String| {
        let api = &api;
        async move {
            let res = api
                .request(reqwest::Method::GET, &path)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            res.text().await.unwrap()
        }
    };
    let parent_page = html(format!("/sagas/{id}")).await;
    assert!(
        parent_page.contains("<h2>Child sagas</h2>"),
        "{parent_page}"
    );
    assert!(parent_page.contains(&format!("href=\"/sagas/{child}\"")));
    let child_page = html(format!("/sagas/{child}")).await;
    assert!(
        child_page.contains(&format!("id=\"parent\" href=\"/sagas/{id}\"")),
        "{child_page}"
    );
    rt.shutdown().await;
}
