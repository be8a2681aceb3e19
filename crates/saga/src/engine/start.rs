//! Starting sagas: now, or queued behind the admission bound; keyed (idempotent) and
//! in batches; the checks a start passes before anything is written.

use super::*;

impl Engine {
    /// Starts saga `name` (its newest registered version) with `data`, in `tx`: the
    /// instance, its first step(s) as dispatched, their compensation-ledger entries and
    /// command messages are written together, or not at all.
    ///
    /// # Errors
    /// [`Error::UnknownSaga`] for an unregistered name; [`Error::Data`] if `data` does
    /// not serialize; store errors.
    pub async fn start<D: Serialize>(&self, tx: &mut Tx, name: &str, data: &D) -> Result<SagaId> {
        self.start_json(tx, name, serde_json::to_value(data)?).await
    }

    /// [`start`](Self::start) with the data already as JSON.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_json(&self, tx: &mut Tx, name: &str, data: Value) -> Result<SagaId> {
        Ok(self.accept(tx, name, data).await?.id())
    }

    /// Starts saga `name` now if its admission bound leaves room and no earlier start
    /// waits; otherwise stores the start to be started, in order, when there is room.
    /// Either way the saga exists exactly when `tx` commits, and never is dropped.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn accept(&self, tx: &mut Tx, name: &str, data: Value) -> Result<Accepted> {
        self.accept_keyed(tx, name, None, data).await
    }

    /// [`accept`](Self::accept) with the caller's idempotency key: the first start of
    /// `name` with `key` starts (or queues) a saga and records the key with it, in
    /// `tx`; every later one, also from another process or racing in another
    /// transaction, writes nothing and answers [`Accepted::Existing`] with the first
    /// saga's id. `None` is a start without a key.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an empty key or one over 256 bytes (nothing written);
    /// as [`start`](Self::start).
    pub async fn accept_keyed(
        &self,
        tx: &mut Tx,
        name: &str,
        key: Option<&str>,
        data: Value,
    ) -> Result<Accepted> {
        let version = self.version_of(name)?;
        let data = self.prepare(name, version, data)?;
        let id = SagaId::new();
        let now = tx.store().clock().now_ms();
        if let Some(key) = key {
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                return Err(Error::InvalidKey {
                    key: key.chars().take(64).collect(),
                    reason: format!("a key is 1 to {MAX_KEY_BYTES} bytes"),
                });
            }
            if let Some(existing) = admission::claim_key(tx.conn(), name, key, id, now).await? {
                return Ok(Accepted::Existing(existing));
            }
        }
        if let Some(bound) = self.max_in_flight(name)
            && (admission::any_waiting(tx.conn(), name).await?
                || self.in_flight_estimate(tx, name).await? >= bound as u64)
        {
            // Checked in full now, not when its turn comes: a start that cannot begin
            // is refused here, with nothing written.
            if let Err(e) = self.check_start(tx.store(), id, name, version, &data) {
                if let Some(key) = key {
                    admission::release_key(tx.conn(), name, key).await?;
                }
                return Err(e);
            }
            let mut headers = Headers::new();
            agentsaga_core::propagation::inject_current(&mut headers);
            admission::push(tx.conn(), id, name, &data, &headers, now).await?;
            tracing::debug!(saga.id = %id, saga.name = %name, "saga start waits for room");
            return Ok(Accepted::Waiting(id));
        }
        self.start_now(tx, id, name, version, data).await?;
        if let Some(seen) = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(name)
        {
            seen.1 += 1;
        }
        Ok(Accepted::Started(id))
    }

    /// [`accept`](Self::accept) for many starts of saga `name` in `tx`, decided in
    /// order as that many `accept`s would be (the starts past the admission bound
    /// wait, in order), but written in a few statements for the lot instead of a few
    /// per saga: the instances in one, their first steps in one, their first messages
    /// in one batch (SQLite: all three in one round trip). Each saga's first messages
    /// carry the trace context of an `outbox.enqueue` span of their own under the
    /// saga's `saga.start`, so each saga is one trace as when started alone (the
    /// batch's own enqueue span stands apart). The answers come in the order of `data`.
    ///
    /// # Errors
    /// As [`start`](Self::start); a `data` that fails its saga's checks fails the
    /// whole call before anything is written.
    pub async fn accept_many(
        &self,
        tx: &mut Tx,
        name: &str,
        data: Vec<Value>,
    ) -> Result<Vec<Accepted>> {
        let version = self.version_of(name)?;
        let data = data
            .into_iter()
            .map(|d| self.prepare(name, version, d))
            .collect::<Result<Vec<_>>>()?;
        let room = match self.max_in_flight(name) {
            None => data.len(),
            Some(_) if data.is_empty() => 0,
            Some(bound) => {
                if admission::any_waiting(tx.conn(), name).await? {
                    0
                } else {
                    let n = self.in_flight_estimate(tx, name).await?;
                    usize::try_from((bound as u64).saturating_sub(n)).unwrap_or(usize::MAX)
                }
            }
        };
        let mut accepted = Vec::with_capacity(data.len());
        let mut insts = Vec::new();
        let mut waits = Vec::new();
        let mut send = Vec::new();
        let mut later = Vec::new();
        let now = tx.store().clock().now_ms();
        for data in data {
            let id = SagaId::new();
            if insts.len() >= room {
                self.check_start(tx.store(), id, name, version, &data)?;
                later.push((id, data));
                accepted.push(Accepted::Waiting(id));
                continue;
            }
            let (inst, mut fx, span) =
                self.begin_instance(id, name, version, data, 0, None, None, now)?;
            span.in_scope(|| agentsaga_core::propagation::stamp_enqueue(&mut fx.send));
            if !fx.waits.is_empty() {
                waits.push((id, fx.waits));
            }
            send.extend(fx.send);
            insts.push(inst);
            accepted.push(Accepted::Started(id));
        }
        persist::insert_new(tx, &insts, &waits, now, &send).await?;
        for (id, data) in &later {
            let mut headers = Headers::new();
            agentsaga_core::propagation::inject_current(&mut headers);
            admission::push(tx.conn(), *id, name, data, &headers, now).await?;
        }
        if !later.is_empty() {
            tracing::debug!(saga.name = %name, waiting = later.len(), "saga starts wait for room");
        }
        if let Some(seen) = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(name)
        {
            seen.1 += insts.len() as u64;
        }
        Ok(accepted)
    }

    /// Sagas of `name` in flight, as a start decides on it: counted in `tx` at most
    /// every [`IN_FLIGHT_FRESH`], and in between the last count plus the starts made
    /// here since (sagas finished meanwhile are noticed at the next count). Counting
    /// on every start cost PostgreSQL a scan of up to `bound` index entries per start.
    pub(super) async fn in_flight_estimate(&self, tx: &mut Tx, name: &str) -> Result<u64> {
        let now = std::time::Instant::now();
        let cached = self
            .in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .copied();
        if let Some((at, n)) = cached
            && now.duration_since(at) < IN_FLIGHT_FRESH
        {
            return Ok(n);
        }
        let n = admission::in_flight(tx.conn(), name).await?;
        self.in_flight_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), (now, n));
        Ok(n)
    }

    /// Starts saga `name` now if its admission bound leaves room and no earlier start
    /// waits; otherwise writes nothing and answers [`Error::Busy`].
    ///
    /// # Errors
    /// [`Error::Busy`]; as [`start`](Self::start).
    pub async fn try_start_json(&self, tx: &mut Tx, name: &str, data: Value) -> Result<SagaId> {
        let version = self.version_of(name)?;
        let data = self.prepare(name, version, data)?;
        if let Some(bound) = self.max_in_flight(name) {
            let in_flight = admission::in_flight(tx.conn(), name).await?;
            if in_flight >= bound as u64 || admission::any_waiting(tx.conn(), name).await? {
                return Err(Error::Busy {
                    name: name.to_owned(),
                    in_flight,
                    bound,
                });
            }
        }
        let id = SagaId::new();
        self.start_now(tx, id, name, version, data).await?;
        Ok(id)
    }

    pub(crate) fn version_of(&self, name: &str) -> Result<i32> {
        self.latest
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownSaga(name.to_owned()))
    }

    /// Starts instance `id` of saga `name` at once, in `tx`: no wait for room, no
    /// parent.
    pub(super) async fn start_now(
        &self,
        tx: &mut Tx,
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
    ) -> Result<()> {
        let now = tx.store().clock().now_ms();
        let (inst, fx, span) = self.begin_instance(id, name, version, data, 0, None, None, now)?;
        self.write(tx, &inst, None, fx).instrument(span).await
    }

    /// A new instance `id` of saga `name` and the effects of its start, decided in its
    /// `saga.start` span (a child of the context in `parent`, if any), which is
    /// returned: the start's writes belong in it. `link`: the parent step of a child
    /// saga.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin_instance(
        &self,
        id: SagaId,
        name: &str,
        version: i32,
        data: Value,
        waited_ms: i64,
        parent: Option<&Headers>,
        link: Option<model::ParentLink>,
        now_ms: i64,
    ) -> Result<(Instance, Effects, tracing::Span)> {
        let span = tracing::info_span!(
            "saga.start",
            saga.id = %id,
            saga.name = %name,
            saga.version = version,
            waited_ms,
            otel.kind = "producer",
        );
        if let Some(headers) = parent {
            agentsaga_core::propagation::adopt(&span, headers);
        }
        let mut inst = Instance::new(id, name, version, data, link);
        inst.trace = span.in_scope(agentsaga_core::propagation::current_traceparent);
        let (inst, fx) = span.in_scope(|| self.decide_start(inst, waited_ms, now_ms))?;
        Ok((inst, fx, span))
    }

    /// New instance `inst` started (after `waited_ms` waiting for room) and the
    /// effects of its start: decided, no I/O.
    pub(super) fn decide_start(
        &self,
        mut inst: Instance,
        waited_ms: i64,
        now_ms: i64,
    ) -> Result<(Instance, Effects)> {
        let mut ctx = self.ctx(&mut inst, now_ms)?;
        ctx.start(std::time::Duration::from_millis(waited_ms.max(0) as u64))?;
        let fx = std::mem::take(&mut ctx.fx);
        Ok((inst, fx))
    }

    /// Could start `id` of saga `name` with (prepared) `data` begin on `store`? Its
    /// first step(s) decided as a start would, and every message it would write
    /// checked as an enqueue would check it. No I/O: for a start stored to begin
    /// later, which must not fail then.
    pub(crate) fn check_start(
        &self,
        store: &Store,
        id: SagaId,
        name: &str,
        version: i32,
        data: &Value,
    ) -> Result<()> {
        let (_, fx) = self.decide_start(
            Instance::new(id, name, version, data.clone(), None),
            0,
            store.clock().now_ms(),
        )?;
        for m in &fx.send {
            store.check_message(m)?;
        }
        Ok(())
    }

    /// The input check of [`prepare`](Self::prepare) on stored (prepared) data: does it
    /// still decode as the typed saga's input (a deploy may have changed it)?
    pub(super) fn prepare_input(&self, name: &str, version: i32, data: &Value) -> Result<()> {
        match self
            .defs
            .get(&(name.to_owned(), version))
            .and_then(|d| d.input.as_ref())
        {
            Some(input) => input.check(data),
            None => Ok(()),
        }
    }

    /// The signals saga `inst` has received, if its definition waits for any (no
    /// read otherwise).
    pub(super) async fn signals_of(
        &self,
        tx: &mut Tx,
        inst: &Instance,
    ) -> Result<BTreeMap<String, protocol::StepOutcome>> {
        let waits = self
            .defs
            .get(&(inst.name.clone(), inst.version))
            .is_some_and(|d| d.is_planned() || !d.waits().is_empty());
        if !waits {
            return Ok(BTreeMap::new());
        }
        signals::received(tx, inst.id).await
    }
}
