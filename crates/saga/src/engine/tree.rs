//! A saga tree's budgets: a child saga's spending counts against its ancestors'
//! budgets (its root's above all) as it happens, not only once the child answers. Before
//! a child (or a saga with children) decides, the engine reads the budgets above it and
//! what each one's whole tree has used: each saga's own usage (its `usage` less what it
//! took from its children's answers, counted where the children spent it), summed over
//! the tree. Two reads, in the event's transaction; none for a saga without parent or
//! children.

use std::collections::HashMap;

use agentsaga_core::Sql;

use super::model::Spender;
use super::*;
use crate::budget::{BudgetRecord, Usage};

impl Engine {
    /// The budgets that `inst`'s dispatches count against beside its own: its
    /// ancestors' with what their trees used, and its own with its children's when it
    /// has children.
    pub(super) async fn spenders_of(&self, tx: &mut Tx, inst: &Instance) -> Result<Vec<Spender>> {
        let has_children = inst
            .steps
            .values()
            .any(|r| crate::definition::child_of(&r.destination).is_some());
        if inst.parent.is_none() && !has_children {
            return Ok(Vec::new());
        }
        // A root's chain is itself, read with this hop.
        let chain = match inst.parent {
            None => vec![(inst.id, inst.budget.clone())],
            Some(_) => up(tx, inst.id).await?,
        };
        let Some(root) = chain.last().map(|(id, _)| *id) else {
            return Ok(Vec::new());
        };
        let mut spenders: Vec<Spender> = chain
            .into_iter()
            .filter(|(id, _)| *id != inst.id || has_children)
            .filter_map(|(id, record)| {
                let record = record?;
                (!record.limit.is_empty()).then(|| Spender {
                    id,
                    limit: record.limit,
                    on_spent: record.on_spent,
                    used: Usage::default(),
                })
            })
            .collect();
        if spenders.is_empty() {
            return Ok(spenders);
        }
        let (parents, own) = down(tx, root).await?;
        for (saga, used) in own {
            // Every spender above `saga` (or `saga` itself) counts what it used.
            let mut at = Some(saga);
            while let Some(id) = at {
                if let Some(s) = spenders.iter_mut().find(|s| s.id == id) {
                    s.used += used;
                }
                at = parents.get(&id).copied().flatten();
            }
        }
        Ok(spenders)
    }
}

/// After a raise of saga `id`'s budget: wakes, in `tx`, each saga below it whose
/// dispatches its tree's spent budget held (they go once the budgets allow).
pub(super) async fn wake_held_below(tx: &mut Tx, id: SagaId) -> Result<()> {
    let rows = Sql::new(
        "WITH RECURSIVE down(id) AS (
            SELECT id FROM saga_instances WHERE parent_id = ?
            UNION SELECT i.id FROM saga_instances i JOIN down ON i.parent_id = down.id)
         SELECT i.id, i.name, i.version, i.budget, i.trace_parent FROM saga_instances i
         WHERE i.id IN (SELECT id FROM down) AND i.budget IS NOT NULL",
    )
    .bind(*id.as_uuid())
    .fetch_all(tx.conn())
    .await?
    .iter()
    .map(|r| {
        Ok((
            r.text("id")?,
            r.text("name")?,
            r.int("version")?,
            r.opt_text("budget")?,
            r.opt_text("trace_parent")?,
        ))
    })
    .collect::<agentsaga_core::Result<Vec<_>>>()?;
    let mut wake = Vec::new();
    for (child, name, version, budget, trace) in rows {
        let Some(record) = budget
            .map(|b| serde_json::from_str::<BudgetRecord>(&b))
            .transpose()?
        else {
            continue;
        };
        if record.held.is_empty() {
            continue;
        }
        let version = i32::try_from(version)
            .map_err(|_| Error::Corrupt(format!("saga {child}: version {version}")))?;
        let orchestrator = crate::orchestrator_destination(&name, version);
        let mut raised = protocol::budget_raised(parse_id(&child)?, &orchestrator);
        // In the child's trace (its kept context), as an operator's act on it is.
        if let Some(traceparent) = trace {
            raised
                .headers
                .insert(agentsaga_core::header::TRACEPARENT.to_owned(), traceparent);
        }
        wake.push(raised);
    }
    if !wake.is_empty() {
        tx.enqueue_batch(&wake).await?;
    }
    Ok(())
}

/// Saga `id`, then its parent, up to its root, with their budgets.
async fn up(tx: &mut Tx, id: SagaId) -> Result<Vec<(SagaId, Option<BudgetRecord>)>> {
    let sql = Sql::new(
        "WITH RECURSIVE up(id, parent_id, budget, depth) AS (
            SELECT id, parent_id, budget, 0 FROM saga_instances WHERE id = ?
            UNION ALL
            SELECT i.id, i.parent_id, i.budget, up.depth + 1
            FROM saga_instances i JOIN up ON i.id = up.parent_id
            WHERE up.depth < 1000)
         SELECT id, budget FROM up ORDER BY depth",
    )
    .bind(*id.as_uuid());
    let rows = tx
        .read(&sql)
        .await?
        .iter()
        .map(|r| Ok((r.text("id")?, r.opt_text("budget")?)))
        .collect::<agentsaga_core::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(id, budget)| {
            let id = parse_id(&id)?;
            let record = budget.map(|b| serde_json::from_str(&b)).transpose()?;
            Ok((id, record))
        })
        .collect()
}

/// The sagas of `root`'s tree: each one's parent, and what it used itself (its usage
/// less what its child steps took from their children's answers).
async fn down(
    tx: &mut Tx,
    root: SagaId,
) -> Result<(HashMap<SagaId, Option<SagaId>>, HashMap<SagaId, Usage>)> {
    let sql = Sql::new(
        "WITH RECURSIVE down(id) AS (
            SELECT ? UNION SELECT i.id FROM saga_instances i JOIN down ON i.parent_id = down.id)
         SELECT 'i' AS kind, i.id AS id, i.parent_id AS parent, i.usage AS usage
            FROM saga_instances i WHERE i.id IN (SELECT id FROM down)
         UNION ALL
         SELECT 's', s.saga_id, NULL, s.usage FROM saga_steps s
            WHERE s.saga_id IN (SELECT id FROM down) AND s.destination LIKE 'saga.%.child'",
    )
    .bind(*root.as_uuid());
    let rows = tx
        .read(&sql)
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.text("kind")?,
                r.text("id")?,
                r.opt_text("parent")?,
                r.opt_text("usage")?,
            ))
        })
        .collect::<agentsaga_core::Result<Vec<_>>>()?;
    let mut parents = HashMap::new();
    let mut total: HashMap<SagaId, Usage> = HashMap::new();
    let mut taken: HashMap<SagaId, Usage> = HashMap::new();
    for (kind, id, parent, usage) in rows {
        let id = parse_id(&id)?;
        let usage: Usage = match usage.as_deref() {
            None | Some("") => Usage::default(),
            Some(u) => serde_json::from_str(u)?,
        };
        if kind == "i" {
            parents.insert(id, parent.as_deref().map(parse_id).transpose()?);
            *total.entry(id).or_default() += usage;
        } else {
            *taken.entry(id).or_default() += usage;
        }
    }
    let own = total
        .into_iter()
        .map(|(id, used)| {
            let taken = taken.get(&id).copied().unwrap_or_default();
            (id, used.since(&taken))
        })
        .collect();
    Ok((parents, own))
}

fn parse_id(s: &str) -> Result<SagaId> {
    s.parse()
        .map_err(|e| Error::Corrupt(format!("saga id `{s}`: {e}")))
}
