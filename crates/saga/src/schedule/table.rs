//! Schedules in `saga_schedules`: create, replace, pause, resume, delete, read. Every
//! change that moves a schedule's calendar (create, replace, resume) sets its next
//! slot from now, by the database's clock (this process's on SQLite): slots before the
//! change are not caught up.

use agentsaga_core::{Row, Sql, Store, Tx};

use super::{CatchUp, Overlap, Schedule, ScheduleView};
use crate::{Error, Result, SagaId};

/// The columns a [`ScheduleView`] reads.
pub(super) const COLUMNS: &str = "name, saga_name, input, cron, time_zone, overlap, catch_up, \
     catch_up_max, late_after_ms, jitter_ms, paused, next_slot_ms, next_due_ms, \
     queued_slot_ms, last_slot_ms, last_saga_id, last_fired_ms, last_error, fired, skipped, \
     created_ms, updated_ms";

/// Stores `schedule` (checked first) with its first slot after now.
///
/// # Errors
/// [`Error::InvalidSchedule`]; [`Error::ScheduleExists`] if one has its name (nothing
/// written); store errors.
pub async fn create(store: &Store, schedule: &Schedule) -> Result<ScheduleView> {
    write(store, schedule, false).await
}

/// Stores `schedule`, replacing the one of its name if there is one (its counts and
/// last firing are kept; a slot queued for it is dropped) and setting its next slot
/// from now.
///
/// # Errors
/// [`Error::InvalidSchedule`]; store errors.
pub async fn put(store: &Store, schedule: &Schedule) -> Result<ScheduleView> {
    write(store, schedule, true).await
}

async fn write(store: &Store, s: &Schedule, replace: bool) -> Result<ScheduleView> {
    let calendar = s.calendar()?;
    let input = serde_json::to_string(&s.input)?;
    let mut tx = store.begin().await?;
    // The row locked first, then the clock read: a firing that holds it has moved the
    // row on when this reads now, so the next slot set here comes after its slots.
    read(&mut tx, &s.name).await?;
    let now = clock(&mut tx).await?;
    let (next_slot, next_due) = calendar.next_due(ms(s.jitter), now);
    let (catch_up, max) = catch_up_columns(s.catch_up);
    let text = format!(
        "INSERT INTO saga_schedules (name, saga_name, input, cron, time_zone, overlap, catch_up, \
         catch_up_max, late_after_ms, jitter_ms, paused, next_slot_ms, next_due_ms, created_ms, \
         updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) {}",
        if replace {
            "DO UPDATE SET saga_name = excluded.saga_name, input = excluded.input, \
             cron = excluded.cron, time_zone = excluded.time_zone, overlap = excluded.overlap, \
             catch_up = excluded.catch_up, catch_up_max = excluded.catch_up_max, \
             late_after_ms = excluded.late_after_ms, jitter_ms = excluded.jitter_ms, \
             paused = excluded.paused, next_slot_ms = excluded.next_slot_ms, \
             next_due_ms = excluded.next_due_ms, queued_slot_ms = NULL, \
             updated_ms = excluded.updated_ms"
        } else {
            "DO NOTHING"
        }
    );
    let written = Sql::new(text)
        .bind(s.name.as_str())
        .bind(s.saga.as_str())
        .bind_json(input.as_str())
        .bind(s.cron.as_str())
        .bind(s.time_zone.as_str())
        .bind(s.overlap.to_string())
        .bind(catch_up)
        .bind(max)
        .bind(ms(s.late_after))
        .bind(ms(s.jitter))
        .bind(s.paused)
        .bind(next_slot)
        .bind(next_due)
        .bind(now)
        .bind(now)
        .execute(tx.conn())
        .await?;
    if written == 0 {
        return Err(Error::ScheduleExists(s.name.clone()));
    }
    let view = read(&mut tx, &s.name)
        .await?
        .ok_or_else(|| Error::NoSchedule(s.name.clone()))?;
    tx.commit().await?;
    Ok(view)
}

/// Pauses schedule `name`: it fires nothing until resumed (a slot queued for it is
/// dropped). Pausing a paused schedule changes nothing.
///
/// # Errors
/// [`Error::NoSchedule`]; store errors.
pub async fn pause(store: &Store, name: &str) -> Result<ScheduleView> {
    set_paused(store, name, true).await
}

/// Resumes schedule `name` from its first slot after now (the slots it slept through
/// are not caught up). Resuming a running schedule changes nothing.
///
/// # Errors
/// [`Error::NoSchedule`]; store errors.
pub async fn resume(store: &Store, name: &str) -> Result<ScheduleView> {
    set_paused(store, name, false).await
}

async fn set_paused(store: &Store, name: &str, paused: bool) -> Result<ScheduleView> {
    let mut tx = store.begin().await?;
    let view = read(&mut tx, name)
        .await?
        .ok_or_else(|| Error::NoSchedule(name.into()))?;
    if view.schedule.paused == paused {
        return Ok(view);
    }
    let now = clock(&mut tx).await?;
    // Paused, it keeps its next slot (its expression is not read: a schedule this
    // binary cannot read can be paused); resumed, it goes on from now.
    let (next_slot, next_due) = if paused {
        (view.next_slot_ms, view.next_due_ms)
    } else {
        let calendar = view.schedule.calendar()?;
        calendar.next_due(ms(view.schedule.jitter), now)
    };
    Sql::new(
        "UPDATE saga_schedules SET paused = ?, next_slot_ms = ?, next_due_ms = ?, \
         queued_slot_ms = NULL, updated_ms = ? WHERE name = ?",
    )
    .bind(paused)
    .bind(next_slot)
    .bind(next_due)
    .bind(now)
    .bind(name)
    .execute(tx.conn())
    .await?;
    let view = read(&mut tx, name)
        .await?
        .ok_or_else(|| Error::NoSchedule(name.into()))?;
    tx.commit().await?;
    Ok(view)
}

/// Deletes schedule `name`; the sagas it started are left alone. `false` if there was
/// none.
///
/// # Errors
/// Store errors.
pub async fn delete(store: &Store, name: &str) -> Result<bool> {
    let mut tx = store.begin().await?;
    let n = Sql::new("DELETE FROM saga_schedules WHERE name = ?")
        .bind(name)
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    Ok(n > 0)
}

/// Schedule `name`, if there is one.
///
/// # Errors
/// Store errors; [`Error::Corrupt`] for a row this binary did not write.
pub async fn get(store: &Store, name: &str) -> Result<Option<ScheduleView>> {
    Sql::new(format!(
        "SELECT {COLUMNS} FROM saga_schedules WHERE name = ?"
    ))
    .bind(name)
    .fetch_optional(store.reader())
    .await?
    .map(|r| view(&r))
    .transpose()
}

/// Every schedule, by name.
///
/// # Errors
/// As [`get`].
pub async fn list(store: &Store) -> Result<Vec<ScheduleView>> {
    Sql::new(format!(
        "SELECT {COLUMNS} FROM saga_schedules ORDER BY name"
    ))
    .fetch_all(store.reader())
    .await?
    .iter()
    .map(view)
    .collect()
}

/// Schedule `name` in `tx`, its row locked where the database locks rows.
pub(super) async fn read(tx: &mut Tx, name: &str) -> Result<Option<ScheduleView>> {
    let sql = Sql::new(format!(
        "SELECT {COLUMNS} FROM saga_schedules WHERE name = ?"
    ));
    sql.bind(name)
        .for_update()
        .fetch_optional(tx.conn())
        .await?
        .map(|r| view(&r))
        .transpose()
}

/// Whether schedule `name` exists (its row read without a lock).
pub(super) async fn exists(tx: &mut Tx, name: &str) -> Result<bool> {
    let row = Sql::new("SELECT count(*) AS n FROM saga_schedules WHERE name = ?")
        .bind(name)
        .fetch_one(tx.conn())
        .await?;
    Ok(row.int("n")? > 0)
}

/// As [`read`], but `None` also when another transaction holds the row (a process
/// firing it, or frozen while it fired it): the firing leaves it to that one.
pub(super) async fn read_unless_held(tx: &mut Tx, name: &str) -> Result<Option<ScheduleView>> {
    let sql = Sql::new(format!(
        "SELECT {COLUMNS} FROM saga_schedules WHERE name = ?"
    ));
    sql.bind(name)
        .for_update_skip_locked()
        .fetch_optional(tx.conn())
        .await?
        .map(|r| view(&r))
        .transpose()
}

/// Now, by the database's clock (this process's on SQLite), in whole Unix ms.
pub(super) async fn clock(tx: &mut Tx) -> Result<i64> {
    let r = Sql::new("SELECT {clock_ms} AS now")
        .fetch_one(tx.conn())
        .await?;
    #[allow(clippy::cast_possible_truncation)]
    Ok(r.real("now")?.floor() as i64)
}

pub(super) fn ms(d: std::time::Duration) -> i64 {
    agentsaga_core::clock::millis(d)
}

fn catch_up_columns(c: CatchUp) -> (&'static str, i64) {
    match c {
        CatchUp::All { max } => ("all", i64::from(max)),
        other => (other.policy(), 0),
    }
}

fn view(r: &Row) -> Result<ScheduleView> {
    let corrupt = |what: String| Error::Corrupt(format!("saga_schedules: {what}"));
    let duration = |col: &str| -> Result<std::time::Duration> {
        let v = r.int(col)?;
        u64::try_from(v)
            .map(std::time::Duration::from_millis)
            .map_err(|_| corrupt(format!("{col} {v}")))
    };
    let catch_up = match r.text("catch_up")?.as_str() {
        "all" => CatchUp::All {
            max: u32::try_from(r.int("catch_up_max")?)
                .map_err(|_| corrupt("catch_up_max".into()))?,
        },
        other => other.parse().map_err(corrupt)?,
    };
    let input = r.text("input")?;
    Ok(ScheduleView {
        schedule: Schedule {
            name: r.text("name")?,
            saga: r.text("saga_name")?,
            input: serde_json::from_str(&input)?,
            cron: r.text("cron")?,
            time_zone: r.text("time_zone")?,
            overlap: r.text("overlap")?.parse::<Overlap>().map_err(corrupt)?,
            catch_up,
            late_after: duration("late_after_ms")?,
            jitter: duration("jitter_ms")?,
            paused: r.bool("paused")?,
        },
        next_slot_ms: r.opt_int("next_slot_ms")?,
        next_due_ms: r.opt_int("next_due_ms")?,
        queued_slot_ms: r.opt_int("queued_slot_ms")?,
        last_slot_ms: r.opt_int("last_slot_ms")?,
        last_saga_id: r.opt_uuid("last_saga_id")?.map(SagaId::from),
        last_fired_ms: r.opt_int("last_fired_ms")?,
        last_error: r.opt_text("last_error")?,
        fired: r.int("fired")?,
        skipped: r.int("skipped")?,
        created_ms: r.int("created_ms")?,
        updated_ms: r.int("updated_ms")?,
    })
}
