//! Outside calls recorded once and replayed in tests ([`Recording`]): a
//! [`CallingAgent`]'s `call` (an LLM, an API) answered for real in a recording run,
//! its results kept in a JSON file beside the test, and read back from it in every
//! later run, without the call.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentsaga_saga::{SagaId, Usage, protocol};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::{AgentContext, CallContext, CallingAgent, Meter, StepError};
use crate::faults::lock;
use crate::{Error, Result};

/// The environment variable that makes [`Recording::from_env`] record: set to `1`.
pub const RECORD_VAR: &str = "AGENTSAGA_RECORD";

/// A file of recorded outside calls, shared by the agents it wraps
/// ([`wrap`](Self::wrap)). Recording, each `call` runs for real and its result (an
/// output or an error) is written to the file, at once; replaying, each `call` is
/// answered from the file and the real one never runs. A call the file does not hold
/// is an error naming the step and the file, never a live call.
///
/// Calls are matched by the step's idempotency key with the saga's id taken out (it
/// is new in every run): the destination, the step's name and whether it is the
/// command or the compensation, and the command's payload. Calls that match alike
/// are answered in the order they were recorded (a retry after a recorded error gets
/// the next answer), the last one again once they are spent.
///
/// ```no_run
/// # use agentsaga_runtime::{Runtime, testing::{Recording, TestRuntime}};
/// # struct Llm;
/// # async fn demo(llm: impl agentsaga_runtime::CallingAgent<Output = String>) -> agentsaga_runtime::Result<()> {
/// // `AGENTSAGA_RECORD=1 cargo test` records (real calls); `cargo test` replays.
/// let calls = Recording::from_env("tests/recordings/assistant.json")?;
/// let t = TestRuntime::start(Runtime::builder().calling_agent(calls.wrap(llm))).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Recording {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    record: bool,
    book: Mutex<Book>,
    /// Replaying: how many answers each (key, request) has taken.
    taken: Mutex<HashMap<(String, String), usize>>,
}

/// The file: every call in the order it was recorded.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Book {
    calls: Vec<Call>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Call {
    /// `destination:step:command` (or `:compensate`); a message not sent by a saga:
    /// `destination:message`.
    key: String,
    /// The command's payload.
    request: Value,
    result: Outcome,
    /// What the call reported it used (tokens, cost), reported again on replay.
    #[serde(default)]
    usage: Usage,
}

/// A call's result as the file keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Ok(Value),
    Retryable(String),
    Fatal(String),
    Infrastructure(String),
    RateLimited { retry_after_ms: Option<u64> },
}

/// Saga ids whose step asked a recording for a call it does not hold, with the
/// error: [`TestRuntime::run_to_end`](super::TestRuntime::run_to_end) reports it.
/// Process-wide (tests of one binary share it), keyed by saga ids, which are unique.
static MISSED: Mutex<Option<HashMap<SagaId, String>>> = Mutex::new(None);

/// The miss of saga `id`, if one of its steps asked a recording for a call it did
/// not hold.
pub(super) fn missed(id: SagaId) -> Option<String> {
    lock(&MISSED).as_ref().and_then(|m| m.get(&id).cloned())
}

impl Recording {
    /// Replays the calls recorded in `path`. A file that does not exist yet holds no
    /// call: each call is then an error telling how to record it.
    ///
    /// # Errors
    /// [`Error::NotRecorded`] for a file that cannot be read or is not a recording.
    pub fn replay(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let book = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                Error::NotRecorded(format!("{} is not a recording: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => {
                return Err(Error::NotRecorded(format!(
                    "{} cannot be read: {e}",
                    path.display()
                )));
            }
        };
        Ok(Self::with(path, false, book))
    }

    /// Records into `path`: every call runs for real, and the file is written anew
    /// (what it held before is replaced) after each one.
    pub fn record(path: impl AsRef<Path>) -> Self {
        Self::with(path.as_ref().to_path_buf(), true, Book::default())
    }

    /// [`record`](Self::record) when the environment variable `AGENTSAGA_RECORD` is
    /// `1` (or `true`), else [`replay`](Self::replay).
    ///
    /// # Errors
    /// As [`replay`](Self::replay).
    pub fn from_env(path: impl AsRef<Path>) -> Result<Self> {
        match std::env::var(RECORD_VAR).as_deref().map(str::trim) {
            Ok("1" | "true") => Ok(Self::record(path)),
            _ => Self::replay(path),
        }
    }

    fn with(path: PathBuf, record: bool, book: Book) -> Self {
        Self {
            inner: Arc::new(Inner {
                path,
                record,
                book: Mutex::new(book),
                taken: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Is it recording (real calls), rather than replaying?
    pub fn is_recording(&self) -> bool {
        self.inner.record
    }

    /// `agent`, its calls recorded to (or replayed from) this recording. Its
    /// `record` (the database part) runs as ever.
    pub fn wrap<A: CallingAgent>(&self, agent: A) -> Recorded<A> {
        Recorded {
            agent,
            recording: self.clone(),
        }
    }

    /// The distinct keys the file holds (`destination:step:command`), sorted.
    pub fn keys(&self) -> Vec<String> {
        let book = lock(&self.inner.book);
        let keys: HashSet<&str> = book.calls.iter().map(|c| c.key.as_str()).collect();
        let mut keys: Vec<String> = keys.into_iter().map(str::to_owned).collect();
        keys.sort();
        keys
    }

    /// The `taken`-th answer recorded for `key` and `request` (the last one past
    /// them), if any, with the usage its call reported.
    fn answer(&self, key: &str, request: &Value) -> Option<(Outcome, Usage)> {
        let book = lock(&self.inner.book);
        let alike: Vec<&Call> = book
            .calls
            .iter()
            .filter(|c| c.key == key && c.request == *request)
            .collect();
        let mut taken = lock(&self.inner.taken);
        let n = taken
            .entry((key.to_owned(), request.to_string()))
            .or_default();
        let call = alike.get(*n).or_else(|| alike.last())?;
        *n += 1;
        Some((call.result.clone(), call.usage))
    }

    /// Keeps `call` and writes the file (a temporary file renamed over it).
    fn keep(&self, call: Call) -> std::result::Result<(), String> {
        let mut book = lock(&self.inner.book);
        book.calls.push(call);
        let text = serde_json::to_string_pretty(&*book).map_err(|e| e.to_string())?;
        let path = &self.inner.path;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n").map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    }
}

/// A [`CallingAgent`] whose calls a [`Recording`] records or replays
/// ([`Recording::wrap`]).
pub struct Recorded<A> {
    agent: A,
    recording: Recording,
}

#[async_trait::async_trait]
impl<A> CallingAgent for Recorded<A>
where
    A: CallingAgent,
    A::Output: Serialize + DeserializeOwned,
{
    type Command = A::Command;
    type Output = A::Output;
    type Reply = A::Reply;

    fn destination(&self) -> &str {
        self.agent.destination()
    }

    fn estimate_tokens(&self, command: &Self::Command) -> u64 {
        self.agent.estimate_tokens(command)
    }

    async fn call(
        &self,
        ctx: &CallContext<'_>,
        command: &Self::Command,
    ) -> std::result::Result<Self::Output, StepError> {
        let env = ctx.envelope();
        let key = match (ctx.step_name(), protocol::Outbound::parse(env)) {
            (Some(step), Some(protocol::Outbound::Compensation { .. })) => {
                format!("{}:{step}:compensate", env.destination)
            }
            (Some(step), _) => format!("{}:{step}:command", env.destination),
            (None, _) => format!("{}:message", env.destination),
        };
        let request: Value = serde_json::from_str(&env.payload).unwrap_or(Value::Null);
        let path = self.recording.inner.path.display().to_string();
        if !self.recording.inner.record {
            return match self.recording.answer(&key, &request) {
                Some((outcome, usage)) => {
                    ctx.report_usage(usage);
                    replayed(outcome, &key, &path)
                }
                None => Err(self.miss(ctx, &key, &path)),
            };
        }
        // The call's own report of its usage, kept with its answer (and passed on).
        let meter = Meter::default();
        let result = self
            .agent
            .call(&CallContext::metered(env, &meter), command)
            .await;
        let usage = *meter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ctx.report_usage(usage);
        let outcome = match &result {
            Ok(output) => match serde_json::to_value(output) {
                Ok(v) => Outcome::Ok(v),
                Err(e) => {
                    return Err(StepError::Fatal(format!(
                        "recording {key}: its output does not serialize: {e}"
                    )));
                }
            },
            Err(StepError::Retryable(e)) => Outcome::Retryable(e.clone()),
            Err(StepError::Fatal(e)) => Outcome::Fatal(e.clone()),
            Err(StepError::Infrastructure(e)) => Outcome::Infrastructure(e.clone()),
            Err(StepError::RateLimited { retry_after }) => Outcome::RateLimited {
                retry_after_ms: retry_after
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            },
        };
        if let Err(e) = self.recording.keep(Call {
            key: key.clone(),
            request,
            result: outcome,
            usage,
        }) {
            return Err(StepError::Infrastructure(format!(
                "recording {key} into {path}: {e}"
            )));
        }
        result
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        command: Self::Command,
        output: Self::Output,
    ) -> std::result::Result<Self::Reply, StepError> {
        self.agent.record(ctx, command, output).await
    }
}

impl<A> Recorded<A> {
    /// The error of a call the recording does not hold, noted for its saga's
    /// [`run_to_end`](super::TestRuntime::run_to_end).
    fn miss(&self, ctx: &CallContext<'_>, key: &str, path: &str) -> StepError {
        let step = ctx.step_name().unwrap_or("(not a saga step)");
        let why = format!(
            "no recorded answer for step `{step}` (key `{key}`, this command's payload) in \
             {path}: record it with {RECORD_VAR}=1 (a real call), or fix the test's input"
        );
        if let Some(saga) = ctx.saga_id() {
            lock(&MISSED)
                .get_or_insert_with(HashMap::new)
                .entry(saga)
                .or_insert_with(|| why.clone());
        }
        tracing::error!(step, key, path, "{why}");
        StepError::Fatal(why)
    }
}

/// A recorded outcome as the call's result.
fn replayed<O: DeserializeOwned>(
    outcome: Outcome,
    key: &str,
    path: &str,
) -> std::result::Result<O, StepError> {
    match outcome {
        Outcome::Ok(v) => serde_json::from_value(v).map_err(|e| {
            StepError::Fatal(format!(
                "the answer recorded for {key} in {path} does not decode: {e} (record again)"
            ))
        }),
        Outcome::Retryable(e) => Err(StepError::Retryable(e)),
        Outcome::Fatal(e) => Err(StepError::Fatal(e)),
        Outcome::Infrastructure(e) => Err(StepError::Infrastructure(e)),
        Outcome::RateLimited { retry_after_ms } => Err(StepError::RateLimited {
            retry_after: retry_after_ms.map(std::time::Duration::from_millis),
        }),
    }
}
