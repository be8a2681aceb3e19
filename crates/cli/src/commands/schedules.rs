//! `agentsaga schedules list | show | create | put | pause | resume | delete`: the
//! console's schedule calls (`Console::schedules`, …), each one transaction, printed as
//! tables or as their documents (`--json`: the admin API's). The CLI has no saga
//! definitions: a schedule is checked as far as that goes (`Schedule::check`); the
//! process that fires it checks its saga and input.

use std::time::Duration;

use agentsaga_console::Console;
use agentsaga_console::ops::ScheduleDoc;
use agentsaga_console::time::from_now;

use crate::args::{ScheduleArgs, ScheduleName, SchedulesCommand};
use crate::format::{Table, compact_duration, or_dash, print_json, rfc3339, truncate, ts_or_dash};

/// Runs one `schedules` command.
pub(super) async fn run(console: &Console, command: SchedulesCommand) -> anyhow::Result<()> {
    match command {
        SchedulesCommand::List { json } => list(console, json).await,
        SchedulesCommand::Show { name, json } => print(&console.schedule(&name).await?, json),
        SchedulesCommand::Create(a) => write(console, &a, false).await,
        SchedulesCommand::Put(a) => write(console, &a, true).await,
        SchedulesCommand::Pause(n) => set_paused(console, &n, true).await,
        SchedulesCommand::Resume(n) => set_paused(console, &n, false).await,
        SchedulesCommand::Delete { name } => {
            console.delete_schedule(&name).await?;
            outln!("deleted schedule `{name}` (the sagas it started are left as they are)");
            Ok(())
        }
    }
}

async fn list(console: &Console, json: bool) -> anyhow::Result<()> {
    let doc = console.schedules().await?;
    if json {
        return print_json(&doc);
    }
    if doc.schedules.is_empty() {
        outln!("no schedules");
        return Ok(());
    }
    let now = agentsaga_core::clock::system_now_ms();
    let mut table = Table::new(&[
        "NAME",
        "SAGA",
        "CRON",
        "TIME ZONE",
        "PAUSED",
        "NEXT DUE",
        "LAST FIRED",
        "FIRED",
        "SKIPPED",
        "LAST ERROR",
    ])
    .right(&[7, 8]);
    for d in &doc.schedules {
        let (v, s) = (&d.view, &d.view.schedule);
        table.row(vec![
            s.name.clone(),
            s.saga.clone(),
            s.cron.clone(),
            s.time_zone.clone(),
            yes_no(s.paused).to_owned(),
            match (s.paused, v.next_due_ms) {
                (true, _) => "-".to_owned(),
                (false, None) => "none".to_owned(),
                (false, due) => due_text(due, now),
            },
            ts_or_dash(v.last_fired_ms),
            v.fired.to_string(),
            v.skipped.to_string(),
            truncate(&or_dash(v.last_error.as_deref()), 60),
        ]);
    }
    out!("{}", table.render());
    Ok(())
}

/// A schedule as `show` prints it, or its document.
fn print(doc: &ScheduleDoc, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(doc);
    }
    let (view, s) = (&doc.view, &doc.view.schedule);
    let now = agentsaga_core::clock::system_now_ms();
    outln!("schedule     {}", s.name);
    outln!("saga         {}", s.saga);
    outln!("cron         {}", s.cron);
    outln!("time zone    {}", s.time_zone);
    outln!("input        {}", s.input);
    outln!("overlap      {}", s.overlap);
    outln!("catch-up     {}", s.catch_up);
    outln!("late after   {}", compact_duration(s.late_after));
    outln!("jitter       {}", jitter_text(s.jitter));
    if s.paused {
        outln!(
            "paused       yes: it fires nothing (`agentsaga schedules resume {}`)",
            s.name
        );
    } else {
        outln!("paused       no");
    }
    outln!("next slot    {}", ts_or_dash(view.next_slot_ms));
    outln!("next due     {}", due_text(view.next_due_ms, now));
    outln!("queued slot  {}", ts_or_dash(view.queued_slot_ms));
    outln!("last slot    {}", ts_or_dash(view.last_slot_ms));
    outln!(
        "last saga    {}",
        view.last_saga_id
            .map_or_else(|| "-".to_owned(), |id| id.to_string())
    );
    outln!("last fired   {}", ts_or_dash(view.last_fired_ms));
    outln!("last error   {}", or_dash(view.last_error.as_deref()));
    outln!("fired        {}", view.fired);
    outln!("skipped      {}", view.skipped);
    outln!("created      {}", rfc3339(view.created_ms));
    outln!("updated      {}", rfc3339(view.updated_ms));
    Ok(())
}

/// `schedules create | put`: the schedule was checked before the database opened; the
/// store checks it again.
async fn write(console: &Console, args: &ScheduleArgs, replace: bool) -> anyhow::Result<()> {
    let s = args.schedule();
    let doc = if replace {
        console.put_schedule(&s).await?
    } else {
        console.create_schedule(&s).await?
    };
    if args.json {
        return print(&doc, true);
    }
    let view = &doc.view;
    // A row inserted now has its creation as its last change.
    let done = if replace && view.created_ms != view.updated_ms {
        "replaced"
    } else {
        "created"
    };
    outln!(
        "{done} schedule `{}`: saga `{}` at `{}` ({}), {}",
        s.name,
        s.saga,
        s.cron,
        s.time_zone,
        next_text(view)
    );
    Ok(())
}

/// `schedules pause | resume`: a schedule already so is left as it is, and said so.
async fn set_paused(console: &Console, n: &ScheduleName, paused: bool) -> anyhow::Result<()> {
    let name = n.name.as_str();
    let before = console.schedule(name).await?;
    let doc = if paused {
        console.pause_schedule(name).await?
    } else {
        console.resume_schedule(name).await?
    };
    if n.json {
        return print(&doc, true);
    }
    if before.view.schedule.paused == paused {
        let was = if paused {
            "paused already"
        } else {
            "not paused"
        };
        outln!("schedule `{name}` was {was}: nothing changed");
    } else if paused {
        outln!(
            "paused schedule `{name}`: it fires nothing until `agentsaga schedules resume {name}`"
        );
    } else {
        outln!("resumed schedule `{name}`: {}", next_text(&doc.view));
    }
    Ok(())
}

/// When a schedule is next due, for the line a write prints.
fn next_text(view: &agentsaga_saga::schedule::ScheduleView) -> String {
    if view.schedule.paused {
        format!(
            "paused: it fires nothing until `agentsaga schedules resume {}`",
            view.schedule.name
        )
    } else {
        format!(
            "next due {}",
            due_text(view.next_due_ms, agentsaga_core::clock::system_now_ms())
        )
    }
}

/// `2024-05-01T07:00:00.000Z (in 2 h 10 min)`, or `none` when the expression names no
/// time to come.
fn due_text(due_ms: Option<i64>, now: i64) -> String {
    match due_ms {
        Some(ms) => format!("{} ({})", rfc3339(ms), from_now(ms, now)),
        None => "none (its expression names no time to come)".to_owned(),
    }
}

fn jitter_text(d: Duration) -> String {
    if d.is_zero() {
        "none".to_owned()
    } else {
        format!("up to {}", compact_duration(d))
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
