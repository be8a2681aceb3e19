//! A command the other service dead-letters on arrival (too large for its store, bad
//! input) is answered as a local dead letter is: a `DeliveryFailed` notice goes back
//! over the broker, and the saga fails the step and compensates, with the reason, at
//! once (it used to wait with no timer, reported stalled only after 15 minutes).

use agentsaga_core::StoreConfig;

use super::*;

/// reserve (here) → charge (the payments service; its command carries `pad`).
fn padded_saga() -> SagaDefinition {
    Saga::<Value>::builder("padded", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |o: &Value| o["n"].clone()))
        .step(
            Step::new("charge", "payments")
                .command(|o: &Value| o.clone())
                .compensate("payments", |o: &Value| o["n"].clone()),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dead_lettered_by_the_other_service_fails_the_step_there_and_back() {
    let server = NatsServer::start();
    let (url_shop, url_pay) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    // The payments service takes messages of at most 2 KiB; the shop's up to its
    // default.
    let pay = Runtime::builder()
        .database(&url_pay)
        .store_config(StoreConfig::default().max_message_bytes(2048))
        .agent(Recorder("payments"))
        .remote_saga("padded", 1, &link(&server, "payments").await)
        .start()
        .await
        .unwrap();
    effects_table(pay.store()).await;
    let shop = Runtime::builder()
        .database(&url_shop)
        .agent(Recorder("stock"))
        .saga(padded_saga())
        .remote("payments", &link(&server, "shop").await)
        .start()
        .await
        .unwrap();
    effects_table(shop.store()).await;

    let small = shop.start_saga("padded", &json!({ "n": 1 })).await.unwrap();
    let large = shop
        .start_saga("padded", &json!({ "n": 2, "pad": "x".repeat(4000) }))
        .await
        .unwrap();
    let mut states = Vec::new();
    for id in [small, large] {
        let state = tokio::time::timeout(Duration::from_secs(30), shop.wait(id))
            .await
            .unwrap_or_else(|_| panic!("saga {id} did not settle within 30 s"))
            .unwrap();
        states.push(state);
    }
    assert_eq!(states, [SagaState::Completed, SagaState::Compensated]);
    let summary = agentsaga_saga::query::get(shop.store(), large)
        .await
        .unwrap()
        .expect("the saga");
    let error = summary.error.unwrap_or_default();
    assert!(
        error.contains("charge") && error.contains("over the limit of 2048 bytes"),
        "{error}"
    );
    // The command never ran there: no charge, nothing to refund; the reservation here
    // was released. The dead letter is in the payments service, with its reason.
    let theirs: Vec<(String, String)> = effects(pay.store())
        .await
        .into_iter()
        .filter(|(s, _)| *s == large.to_string())
        .collect();
    assert!(theirs.iter().all(|(_, e)| e != "payments/do"), "{theirs:?}");
    let mine: Vec<String> = effects(shop.store())
        .await
        .into_iter()
        .filter(|(s, _)| *s == large.to_string())
        .map(|(_, e)| e)
        .collect();
    assert_eq!(mine, ["stock/do", "stock/undo"]);
    let dead = pay
        .store()
        .admin()
        .dead_letters(Some("payments"), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    shop.shutdown().await;
    pay.shutdown().await;
}
