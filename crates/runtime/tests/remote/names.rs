//! Names an LLM may choose cross the broker as they are: a step named with a line
//! break, a carriage return, a space and non-ASCII travels in the command's headers
//! (`step_name`), which NATS cannot carry as they are (its client used to panic on
//! them, the delivery retried until dead-lettered).

use super::*;

fn odd_saga() -> SagaDefinition {
    Saga::<Value>::builder("odd", 1)
        .step(
            Step::new("charge\nnow\r é", "payments")
                .command(|o: &Value| o.clone())
                .compensate("payments", |o: &Value| o["n"].clone()),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_named_with_a_line_break_and_non_ascii_crosses_the_broker() {
    let server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    let pay = Runtime::builder()
        .database(&url_pay)
        .agent(Recorder("payments"))
        .remote_saga("odd", 1, &link(&server, "payments").await)
        .start()
        .await
        .unwrap();
    effects_table(pay.store()).await;
    let shop = Runtime::builder()
        .database(&url_shop)
        .saga(odd_saga())
        .remote("payments", &link(&server, "shop").await)
        .start()
        .await
        .unwrap();
    let id = shop.start_saga("odd", &json!({ "n": 1 })).await.unwrap();
    let state = tokio::time::timeout(Duration::from_secs(30), shop.wait(id))
        .await
        .expect("the saga settles within 30 s")
        .unwrap();
    assert_eq!(state, SagaState::Completed);
    let theirs: Vec<String> = effects(pay.store())
        .await
        .into_iter()
        .filter(|(s, _)| *s == id.to_string())
        .map(|(_, e)| e)
        .collect();
    assert_eq!(theirs, ["payments/do"]);
    for rt in [&shop, &pay] {
        assert_eq!(rt.store().admin().stats().await.unwrap().dead, 0);
    }
    shop.shutdown().await;
    pay.shutdown().await;
}
