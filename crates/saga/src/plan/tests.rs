//! The plan's checks, references and planner-text parsing.

use std::sync::Arc;

use agentsaga_core::RetryPolicy;

use super::refs::resolve;
use super::*;
use crate::definition::step::Undo;

fn catalog() -> Catalog {
    Catalog {
        destinations: ["search", "calendar", "mail"]
            .into_iter()
            .map(String::from)
            .collect(),
        approvals: ["sign_off".to_owned()].into_iter().collect(),
        agent_signals: std::collections::BTreeSet::new(),
        sagas: std::collections::BTreeMap::new(),
        planner_name: None,
        retry: RetryPolicy::default(),
        timeout: None,
        max_steps: None,
        approve_before: std::collections::BTreeSet::new(),
        max_turns: 1,
        replan_on_failure: false,
    }
}

fn good() -> Plan {
    Plan::new()
        .then(
            PlanStep::command(
                "look",
                "search",
                json!({ "q": { "$from": "/input/topic" } }),
            )
            .nothing_to_undo(),
        )
        .parallel([
            PlanStep::command(
                "book",
                "calendar",
                json!({ "notes": { "$from": "/results/look" } }),
            )
            .compensate(
                "calendar",
                json!({ "cancel": { "$from": "/results/book/id" } }),
            ),
            PlanStep::wait_for("ok", "approval"),
        ])
        .then(PlanStep::command("send", "mail", json!("hi")).pivot())
        .then(PlanStep::command("log", "mail", Value::Null))
}

fn refused(plan: &Plan, needle: &str) {
    match catalog().validate(plan) {
        Err(Error::InvalidPlan(why)) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected InvalidPlan containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn a_good_plan_passes_and_round_trips() {
    let plan = good();
    catalog().validate(&plan).unwrap();
    let text = serde_json::to_string(&plan).unwrap();
    assert_eq!(Plan::from_text(&text).unwrap(), plan);
    let planned = Planned {
        catalog: Arc::new(catalog()),
        planner: None,
    };
    let stages = planned
        .stages(&initial_data(json!({ "topic": "rust" }), Some(&plan)).unwrap())
        .unwrap();
    assert_eq!(
        stages.iter().map(Vec::len).collect::<Vec<_>>(),
        [1, 2, 1, 1]
    );
    assert!(matches!(stages[0][0].undo, Undo::Nothing));
    assert!(matches!(stages[1][0].undo, Undo::FromReply { .. }));
    assert_eq!(stages[1][1].wait.as_deref(), Some("approval"));
    assert!(stages[2][0].pivot && matches!(stages[2][0].undo, Undo::Never));
}

// A wait of a plan is a person's decision, however the plan (an LLM's) writes it:
// marked, named among the saga's approvals, or plain. Only the saga's definition lets
// agents signal a wait (`PlannedBuilder::agent_signals`), and a plan cannot lower it.
#[test]
fn approvals_are_marked_by_the_plan_or_the_saga() {
    let plan = Plan::new()
        .then(PlanStep::command("find", "search", Value::Null).nothing_to_undo())
        .then(PlanStep::approval("ok", "approval"))
        .then(PlanStep::wait_for("boss", "sign_off"))
        .then(PlanStep::wait_for("event", "webhook"))
        .then(PlanStep::command("send", "mail", json!("hi")).pivot());
    catalog().validate(&plan).unwrap();
    let text = serde_json::to_string(&plan).unwrap();
    assert!(text.contains(r#""approval":true"#), "{text}");
    assert_eq!(Plan::from_text(&text).unwrap(), plan);
    let planned = Planned {
        catalog: Arc::new(catalog()),
        planner: None,
    };
    let stages = planned
        .stages(&initial_data(Value::Null, Some(&plan)).unwrap())
        .unwrap();
    let approvals: Vec<(Option<&str>, bool)> = stages
        .iter()
        .flatten()
        .map(|s| (s.wait.as_deref(), s.approval))
        .collect();
    assert_eq!(
        approvals,
        [
            (None, false),
            (Some("approval"), true),
            (Some("sign_off"), true),
            (Some("webhook"), true),
            (None, false),
        ]
    );
    let mut marked = PlanStep::command("send", "mail", Value::Null).pivot();
    marked.approval = true;
    refused(&Plan::new().then(marked), "`approval` marks a wait");

    // The saga lets agents send `webhook` (an outside event): its plain wait is not a
    // person's decision; marked by the plan, it is; `sign_off` stays one either way.
    let mut open = catalog();
    open.agent_signals = ["webhook", "sign_off"].map(String::from).into();
    let planned = Planned {
        catalog: Arc::new(open),
        planner: None,
    };
    let waits = |plan: &Plan| -> Vec<bool> {
        let data = initial_data(Value::Null, Some(plan)).unwrap();
        let stages = planned.stages(&data).unwrap();
        stages.iter().flatten().map(|s| s.approval).collect()
    };
    let plain = Plan::new()
        .then(PlanStep::wait_for("event", "webhook"))
        .then(PlanStep::wait_for("boss", "sign_off"))
        .then(PlanStep::approval("marked", "webhook"));
    assert_eq!(waits(&plain), [false, true, true]);
}

#[test]
fn the_builders_rules_are_enforced() {
    let undone = |p: PlanStep| p.nothing_to_undo();
    refused(&Plan::new(), "no steps");
    refused(
        &Plan::new().then(PlanStep::command("a", "search", Value::Null)),
        "must say how to undo",
    );
    refused(
        &Plan::new()
            .then(undone(PlanStep::command("a", "search", Value::Null)))
            .then(undone(PlanStep::command("a", "mail", Value::Null))),
        "two steps are named `a`",
    );
    refused(
        &Plan::new().then(undone(PlanStep::command("a", "payments", Value::Null))),
        "unknown destination `payments`",
    );
    refused(
        &Plan::new()
            .then(PlanStep::command("a", "search", Value::Null).compensate("refunds", Value::Null)),
        "unknown destination `refunds`",
    );
    refused(
        &Plan::new()
            .then(PlanStep::command("p", "mail", Value::Null).pivot())
            .then(PlanStep::command("b", "mail", Value::Null).compensate("mail", json!(1))),
        "never undone",
    );
    refused(
        &Plan::new()
            .then(PlanStep::command("p", "mail", Value::Null).pivot())
            .then(PlanStep::command("q", "mail", Value::Null).pivot()),
        "more than one pivot",
    );
    refused(
        &Plan::new().parallel([PlanStep::command("p", "mail", Value::Null).pivot()]),
        "parallel group",
    );
    refused(&Plan::new().parallel([]), "empty parallel group");
    refused(
        &Plan::new()
            .then(PlanStep::wait_for("w1", "go"))
            .then(PlanStep::wait_for("w2", "go")),
        "two steps wait for the signal `go`",
    );
    refused(
        &Plan::new().then(undone(PlanStep::command(
            "a",
            "search",
            json!({ "$from": "/results/a" }),
        ))),
        "earlier stage",
    );
    refused(
        &Plan::new().then(undone(PlanStep::command(
            "a",
            "search",
            json!({ "$from": "/etc/passwd" }),
        ))),
        "/etc/passwd",
    );
    let mut both = PlanStep::command("a", "search", Value::Null).nothing_to_undo();
    both.wait_for = Some("x".into());
    refused(&Plan::new().then(both), "not both");
}

#[test]
fn a_planners_text_is_read_as_data() {
    let plan = good();
    let json = serde_json::to_string_pretty(&plan).unwrap();
    let fenced = format!("Here is the plan:\n```json\n{json}\n```\nGood luck!");
    assert_eq!(Plan::from_text(&fenced).unwrap(), plan);
    let prose = format!("Sure. {json} That's it.");
    assert_eq!(Plan::from_text(&prose).unwrap(), plan);
    let bare = serde_json::to_string(&plan.steps).unwrap();
    assert_eq!(Plan::from_text(&bare).unwrap(), plan);
    for nonsense in [
        "I cannot help with that.",
        "{ not json",
        "{\"steps\": 3}",
        "rm -rf / ; {\"steps\": [{\"name\": \"a\", \"exec\": \"sh\"}]}",
    ] {
        assert!(
            matches!(Plan::from_text(nonsense), Err(Error::InvalidPlan(_))),
            "{nonsense}"
        );
    }
    let huge = "x".repeat(MAX_PLAN_BYTES + 1);
    assert!(
        matches!(Plan::from_text(&huge), Err(Error::InvalidPlan(why)) if why.contains("limit"))
    );
}

#[test]
fn references_resolve_against_the_data() {
    let data = json!({ "input": { "topic": "rust" }, "results": { "look": { "n": 3 } } });
    let t = json!({ "q": { "$from": "/input/topic" }, "all": [{ "$from": "/results/look/n" }, { "$from": "/results/none" }] });
    assert_eq!(resolve(&t, &data), json!({ "q": "rust", "all": [3, null] }));
}

/// [`catalog`] with commands to `calendar` held for a person's approval.
fn gated() -> Catalog {
    Catalog {
        approve_before: ["calendar".to_owned()].into_iter().collect(),
        ..catalog()
    }
}

fn refused_by(catalog: &Catalog, plan: Plan, needle: &str) {
    match catalog.accept(plan) {
        Err(Error::InvalidPlan(why)) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected InvalidPlan containing {needle:?}, got {other:?}"),
    }
}

// `max_steps` counts every step (parallel members and waits too) of the plan as
// written, with the reason.
#[test]
fn max_steps_counts_every_step() {
    let capped = |n| Catalog {
        max_steps: Some(n),
        ..catalog()
    };
    refused_by(
        &capped(4),
        good(),
        "the plan has 5 steps; this saga allows at most 4 (PlannedBuilder::max_steps)",
    );
    assert_eq!(capped(5).accept(good()).unwrap(), good());
    // A planner's reply goes the same way.
    let mut data = initial_data(Value::Null, None).unwrap();
    let err = capped(4)
        .fold_plan(&mut data, serde_json::to_value(good()).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidPlan(why) if why.contains("at most 4")),
        "{err:?}"
    );
    assert!(data["plan"].is_null(), "nothing stored: {data}");
}

// Before each stage with a command to an `approve_before` destination, a stage of
// approval waits, one per such member, named and signalled `approve.<step>`; the
// stored plan has them (from a planner's reply too), and they run as approvals whose
// command is the step's, resolved; the step sends what the wait recorded.
#[test]
fn approve_before_inserts_an_approval_wait_per_held_command() {
    let accepted = gated().accept(good()).unwrap();
    let names: Vec<Vec<&str>> = accepted
        .steps
        .iter()
        .map(|st| st.members().iter().map(|s| s.name.as_str()).collect())
        .collect();
    assert_eq!(
        names,
        [
            vec!["look"],
            vec!["approve.book"],
            vec!["book", "ok"],
            vec!["send"],
            vec!["log"]
        ]
    );
    let wait = &accepted.steps[1].members()[0];
    assert_eq!(wait.wait_for.as_deref(), Some("approve.book"));
    assert_eq!(wait.approves.as_deref(), Some("book"));
    assert!(wait.approval);

    // Two held members of a parallel group: their waits together, just before it.
    let two = Plan::new().parallel([
        PlanStep::command("x", "calendar", json!(1)).nothing_to_undo(),
        PlanStep::command("y", "search", json!(2)).nothing_to_undo(),
        PlanStep::command("z", "calendar", json!(3)).nothing_to_undo(),
    ]);
    let accepted_two = gated().accept(two).unwrap();
    assert_eq!(accepted_two.steps.len(), 2);
    let waits: Vec<&str> = accepted_two.steps[0]
        .members()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(waits, ["approve.x", "approve.z"]);

    // A planner's reply is stored as accepted.
    let mut data = initial_data(json!({ "topic": "rust" }), None).unwrap();
    gated()
        .fold_plan(&mut data, serde_json::to_value(good()).unwrap())
        .unwrap();
    assert_eq!(data["plan"], serde_json::to_value(&accepted).unwrap());

    let planned = Planned {
        catalog: Arc::new(gated()),
        planner: None,
    };
    let mut data = initial_data(json!({ "topic": "rust" }), Some(&accepted)).unwrap();
    data["results"]["look"] = json!("found");
    let stages = planned.stages(&data).unwrap();
    let (wait, book) = (&stages[1][0], &stages[2][0]);
    assert!(wait.approval && wait.approves.as_deref() == Some("approve.book"));
    let record = (wait.command)(&data).unwrap();
    assert_eq!(
        record,
        json!({
            "step": "book",
            "destination": "calendar",
            "command": { "notes": "found" },
            // Its undo, shown with it as the plan wrote it.
            "compensation": {
                "destination": "calendar",
                "command": { "cancel": { "$from": "/results/book/id" } },
            },
        })
    );
    // The step sends the recorded command, not one built again.
    assert!(matches!((book.command)(&data), Err(Error::Corrupt(_))));
    data["results"]["approve.book"] = record;
    data["results"]["look"] = json!("changed behind its back");
    assert_eq!((book.command)(&data).unwrap(), json!({ "notes": "found" }));
    let fold = wait.fold.clone().unwrap();
    fold(&mut data, json!("ann")).unwrap();
    assert_eq!(data["results"]["approve.book"]["approved"], "ann");
    assert_eq!(
        data["results"]["approve.book"]["command"],
        json!({ "notes": "found" })
    );
    // Its signal is registered when the wait is reached, not at start.
    let def = crate::SagaDefinition {
        name: "t".into(),
        version: 1,
        stages,
        deadline: None,
        budget: None,
        planned: None,
        input: None,
    };
    assert!(
        def.declared_waits()
            .iter()
            .all(|w| w.name != "approve.book")
    );
}

// A plan cannot get around the approval: it may not declare a step or a signal named
// like the inserted waits, nor mark a wait as the engine's; a held step whose wait's
// name would be too long is refused rather than left unheld.
#[test]
fn a_plan_cannot_pre_empt_the_approval_wait() {
    let book =
        || PlanStep::command("book", "calendar", json!(1)).compensate("calendar", json!("undo"));
    refused_by(
        &gated(),
        Plan::new()
            .then(PlanStep::approval("approve.book", "approve.book"))
            .then(book()),
        "names starting `approve.` are the approval waits",
    );
    refused_by(
        &gated(),
        Plan::new()
            .then(PlanStep::wait_for("fine", "approve.book"))
            .then(book()),
        "signal `approve.book`",
    );
    let mut forged = PlanStep::approval("sure", "sure");
    forged.approves = Some("book".into());
    for c in [gated(), catalog()] {
        refused_by(
            &c,
            Plan::new().then(forged.clone()).then(book()),
            "`approves` marks the approval waits the engine inserts",
        );
    }
    let long = "b".repeat(MAX_PLAN_NAME_BYTES);
    refused_by(
        &gated(),
        Plan::new().then(PlanStep::command(long, "calendar", json!(1)).nothing_to_undo()),
        "shorten the step's name",
    );
    // Nor undo its way to a held destination: a compensation goes there only as the
    // undo of a held command to it.
    refused_by(
        &gated(),
        Plan::new()
            .then(PlanStep::command("look", "search", json!(1)).compensate("calendar", json!("x"))),
        "only a step whose own command goes there",
    );
    gated().accept(Plan::new().then(book())).unwrap();
    // Without `approve_before`, such names are a plan's own.
    catalog()
        .accept(Plan::new().then(PlanStep::approval("approve.book", "approve.book")))
        .unwrap();
}
