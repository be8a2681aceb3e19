//! The wire protocol's builders and parsers.

use std::time::Duration;

use agentsaga_core::{DeliveryFailed, Envelope, header};
use serde_json::json;

use super::*;
use crate::Error;

fn address(saga: SagaId) -> StepAddress<'static> {
    StepAddress {
        saga,
        step: 2,
        name: "hotel",
        orchestrator: "saga.trip.v1",
    }
}

#[test]
fn commands_and_compensations_carry_the_saga_headers() {
    let saga = SagaId::new();
    let cmd = address(saga)
        .command(
            "hotels",
            &json!({"room": 1}),
            Duration::ZERO,
            Some(Duration::from_secs(2)),
        )
        .unwrap();
    let env = envelope(&cmd);
    assert_eq!(env.destination, "hotels");
    assert_eq!(env.key.as_deref(), Some(format!("{saga}:2").as_str()));
    assert_eq!(env.header(header::REPLY_TO), Some("saga.trip.v1"));
    assert_eq!(env.header(header::KIND), Some(KIND_COMMAND));
    assert_eq!(env.header(STEP), Some("2"));
    assert_eq!(env.header(STEP_NAME), Some("hotel"));
    assert_eq!(env.header(header::TIMEOUT_MS), Some("2000"));
    assert_eq!(
        env.header(header::IDEMPOTENCY_KEY),
        Some(format!("agentsaga:{saga}:2:command").as_str())
    );
    assert_eq!(Outbound::parse(&env), Some(Outbound::Command { step: 2 }));
    assert!(!is_compensation(&env));

    let undo = address(saga)
        .compensation("hotels", &json!("cancel"), Duration::ZERO)
        .unwrap();
    let env = envelope(&undo);
    assert_eq!(env.key, cmd.key.clone(), "same key");
    assert_eq!(env.header(header::TIMEOUT_MS), None);
    assert_eq!(
        env.header(header::IDEMPOTENCY_KEY),
        Some(format!("agentsaga:{saga}:2:compensate").as_str())
    );
    assert_eq!(
        Outbound::parse(&env),
        Some(Outbound::Compensation { step: 2 })
    );
    assert!(is_compensation(&env));
}

#[test]
fn every_inbound_kind_parses() {
    let saga = SagaId::new();
    let cmd = address(saga)
        .command("hotels", &json!(null), Duration::ZERO, None)
        .unwrap();
    let cmd_env = envelope(&cmd);
    let id = cmd.id;

    let ok = StepOutcome::Ok(json!("room 7"));
    let r = envelope(&reply(&cmd_env, &ok).unwrap().unwrap());
    assert_eq!(r.destination, "saga.trip.v1");
    assert_eq!(saga_id(&r).unwrap(), saga);
    assert_eq!(
        Inbound::parse(&r).unwrap(),
        Inbound::Reply {
            step: 2,
            causation: id,
            outcome: ok.clone(),
            usage: crate::Usage::default(),
            bad_usage: None,
        }
    );
    // What the work used travels in the `usage` header.
    let used = crate::Usage::tokens(812, 96).with_calls(1);
    let r = envelope(&with_usage(reply(&cmd_env, &ok).unwrap().unwrap(), &used));
    assert_eq!(
        r.header(USAGE),
        Some(r#"{"tokens_in":812,"tokens_out":96,"calls":1}"#)
    );
    assert!(matches!(Inbound::parse(&r).unwrap(), Inbound::Reply { usage, .. } if usage == used));
    // One that does not parse is said so, for the engine to decide (a late reply is
    // ignored, a current one fails its step).
    let bad = envelope(
        &reply(&cmd_env, &ok)
            .unwrap()
            .unwrap()
            .header(USAGE, "{\"calls\":-1}"),
    );
    let Inbound::Reply {
        usage, bad_usage, ..
    } = Inbound::parse(&bad).unwrap()
    else {
        panic!("a reply");
    };
    assert_eq!(usage, crate::Usage::default());
    assert!(bad_usage.unwrap().contains("usage header"));

    let t = envelope(&timed_out(&cmd_env).unwrap());
    assert_eq!(
        Inbound::parse(&t).unwrap(),
        Inbound::Timeout {
            step: 2,
            causation: id
        }
    );

    let s = envelope(&address(saga).start_timer(id, Duration::from_secs(1)));
    assert_eq!(
        Inbound::parse(&s).unwrap(),
        Inbound::StartTimeout {
            step: 2,
            causation: id
        }
    );

    let d = envelope(
        &DeliveryFailed::notice_for(&cmd_env, "gone")
            .unwrap()
            .unwrap(),
    );
    assert_eq!(
        Inbound::parse(&d).unwrap(),
        Inbound::DeliveryFailed {
            step: 2,
            message: id,
            destination: "hotels".into(),
            reason: "gone".into()
        }
    );

    let dl = envelope(&deadline_timer(
        saga,
        "saga.trip.v1",
        Duration::from_secs(9),
    ));
    assert_eq!(saga_id(&dl).unwrap(), saga);
    assert_eq!(Inbound::parse(&dl).unwrap(), Inbound::Deadline);

    let b = envelope(&address(saga).build_compensation());
    assert_eq!(b.destination, "saga.trip.v1");
    assert_eq!(b.key, None, "not held up behind the step's messages");
    assert_eq!(saga_id(&b).unwrap(), saga);
    assert_eq!(
        Inbound::parse(&b).unwrap(),
        Inbound::BuildCompensation {
            step: 2,
            request: b.id
        }
    );
    assert_eq!(Outbound::parse(&b), None, "not sent to agents");
}

#[test]
fn a_reply_that_is_not_an_outcome_is_fatal() {
    let cmd = envelope(
        &address(SagaId::new())
            .command("hotels", &json!(null), Duration::ZERO, None)
            .unwrap(),
    );
    let mut r = envelope(&reply(&cmd, &StepOutcome::Ok(json!(1))).unwrap().unwrap());
    r.payload = r#"{"nope": 1}"#.into();
    let Inbound::Reply { outcome, .. } = Inbound::parse(&r).unwrap() else {
        panic!("a reply");
    };
    assert!(matches!(outcome, StepOutcome::Fatal(e) if e.contains("not a step outcome")));
}

#[test]
fn malformed_messages_are_refused() {
    let saga = SagaId::new();
    let cmd = envelope(
        &address(saga)
            .command("hotels", &json!(null), Duration::ZERO, None)
            .unwrap(),
    );
    let good = envelope(&reply(&cmd, &StepOutcome::Ok(json!(1))).unwrap().unwrap());
    let without = |name: &str| {
        let mut e = good.clone();
        e.headers.remove(name);
        e
    };
    let with = |name: &str, value: &str| {
        let mut e = good.clone();
        e.headers.insert(name.into(), value.into());
        e
    };
    let malformed = |e: &Envelope, what: &str| match Inbound::parse(e) {
        Err(Error::Malformed(m)) => assert!(m.contains(what), "{m} lacks {what}"),
        other => panic!("{other:?}"),
    };
    malformed(&without(STEP), "no step header");
    malformed(&with(STEP, "two"), "step:");
    malformed(&without(header::CAUSATION_ID), "no causation_id");
    malformed(&with(header::CAUSATION_ID, "x"), "causation_id:");
    malformed(
        &with(header::KIND, "gossip"),
        "unknown message kind `gossip`",
    );
    malformed(&without(header::KIND), "unknown message kind ``");
    let mut notice = with(header::KIND, header::KIND_DELIVERY_FAILED);
    notice.payload = "{}".into();
    assert!(matches!(Inbound::parse(&notice), Err(Error::Malformed(_))));

    assert!(
        matches!(saga_id(&without(header::SAGA_ID)), Err(Error::Malformed(m)) if m.contains("no saga_id"))
    );
    assert!(
        matches!(saga_id(&with(header::SAGA_ID, "7")), Err(Error::Malformed(m)) if m.contains("saga_id:"))
    );
    assert_eq!(step_of(&with(STEP, "two")), None);
    assert_eq!(
        Outbound::parse(&good),
        None,
        "a reply is not sent to agents"
    );
}
