//! A car-rental company's HTTP API, outside the saga's database, and its client: the
//! outside world of the trip_booking example's `reserve_car` step.
//!
//! The API: `POST {base}/rentals` with an `Idempotency-Key` header and
//! `{"customer": 7, "reference": "<saga id>"}` reserves a car and answers
//! `{"rental_id": "car-12-5f3a09c1-3"}`; `POST {base}/rentals/cancel` with an `Idempotency-Key`
//! and `{"reference": "<saga id>", "rental_id": "car-12-5f3a09c1-3"}` cancels that rental, or with
//! no `rental_id` every rental of the reference (nothing to cancel is a success). Like a
//! real payment or booking API it remembers every idempotency key: a request with a key
//! it has seen changes nothing and answers what the first one did.
//!
//! [`start`] serves it on 127.0.0.1 (a free port, `base` ending in `/v1`). Each request
//! takes 20–200 ms (seeded) before it takes effect, then is answered at once. Every
//! request that reached it is kept, in arrival order, with a sequence number
//! ([`Service::log`]): the example runs the service inside its own process when it is
//! given no `--car-rental-url`; the whole-system tests run it in the test process
//! and read the log, to check that no reservation was made twice and that none came
//! after its cancellation.

#![allow(unreachable_pub, dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga::prelude::StepError;
use axum::Router;
use axum::extract::{Json, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::{Deserialize, Serialize};

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A reservation made.
    Reserved,
    /// Rentals cancelled (at least one).
    Cancelled,
    /// A cancellation that found nothing to cancel.
    NothingToCancel,
    /// An idempotency key seen before: nothing changed, the first answer given again.
    Repeat,
}

/// A request that reached the service, in arrival order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Its place in the service's order: 1, 2, 3…
    pub seq: u64,
    /// `reserve` or `cancel`.
    pub op: String,
    /// Its `Idempotency-Key`.
    pub key: String,
    /// The client's reference (the saga).
    pub reference: String,
    pub outcome: Outcome,
    /// The rental it made, or the rentals it cancelled.
    pub rentals: Vec<String>,
}

#[derive(Default)]
struct Book {
    /// This run of the service, in its rental ids: a company never hands out one id
    /// twice, even after a restart that forgot its book (the example's in-process
    /// service restarts with its process; ids of a run before must not come back).
    run: String,
    /// rental id → (reference, still in force)
    rentals: HashMap<String, (String, bool)>,
    /// idempotency key → the rentals it answered
    keys: HashMap<String, Vec<String>>,
    log: Vec<Event>,
}

struct Shared {
    seed: u64,
    book: Mutex<Book>,
}

/// The running service; stops when dropped.
pub struct Service {
    /// Its base URL, e.g. `http://127.0.0.1:40123/v1`.
    pub base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Service {
    /// Every request that took effect or was answered as a repeat, in arrival order.
    pub fn log(&self) -> Vec<Event> {
        self.shared.book.lock().expect("not poisoned").log.clone()
    }

    /// (rentals made, rentals in force, requests answered as repeats)
    pub fn counts(&self) -> (usize, usize, usize) {
        let book = self.shared.book.lock().expect("not poisoned");
        let in_force = book.rentals.values().filter(|(_, on)| *on).count();
        let repeats = book
            .log
            .iter()
            .filter(|e| e.outcome == Outcome::Repeat)
            .count();
        (book.rentals.len(), in_force, repeats)
    }
}

/// Starts the service on 127.0.0.1, on a free port; `seed` decides its delays.
///
/// # Errors
/// Binding the port.
pub async fn start(seed: u64) -> anyhow::Result<Service> {
    let shared = Arc::new(Shared {
        seed,
        book: Mutex::new(Book {
            run: format!("{:08x}", fastrand::u32(..)),
            ..Book::default()
        }),
    });
    let app = Router::new()
        .route("/v1/rentals", post(reserve))
        .route("/v1/rentals/cancel", post(cancel))
        .with_state(Arc::clone(&shared));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the car rental service stopped");
        }
    });
    Ok(Service {
        base_url: format!("http://{addr}/v1"),
        shared,
        task,
    })
}

#[derive(Serialize, Deserialize)]
struct ReserveBody {
    customer: u64,
    reference: String,
}

#[derive(Serialize, Deserialize)]
struct CancelBody {
    reference: String,
    #[serde(default)]
    rental_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Rental {
    rental_id: String,
}

type Answer = Result<Json<serde_json::Value>, (StatusCode, String)>;

fn key_of(headers: &HeaderMap) -> Result<String, (StatusCode, String)> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or((
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key is required".into(),
        ))
}

/// The time a request takes before it takes effect: 20–200 ms, by the seed and the key.
async fn travel(seed: u64, key: &str, op: &str) {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (seed, key, op).hash(&mut h);
    tokio::time::sleep(Duration::from_millis(20 + h.finish() % 181)).await;
}

async fn reserve(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<ReserveBody>,
) -> Answer {
    let key = key_of(&headers)?;
    let rentals = arrive(
        shared,
        key,
        "reserve",
        body.reference,
        move |book, key, of| match book.keys.get(key) {
            Some(first) => (Outcome::Repeat, first.clone()),
            None => {
                let id = format!(
                    "car-{}-{}-{}",
                    body.customer,
                    book.run,
                    book.rentals.len() + 1
                );
                book.rentals.insert(id.clone(), (of.to_owned(), true));
                book.keys.insert(key.to_owned(), vec![id.clone()]);
                (Outcome::Reserved, vec![id])
            }
        },
    )
    .await?;
    Ok(Json(serde_json::json!({ "rental_id": rentals[0] })))
}

async fn cancel(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<CancelBody>,
) -> Answer {
    let key = key_of(&headers)?;
    let named = body.rental_id;
    let rentals = arrive(
        shared,
        key,
        "cancel",
        body.reference,
        move |book, key, of| {
            if let Some(first) = book.keys.get(key) {
                return (Outcome::Repeat, first.clone());
            }
            let mut cancelled = Vec::new();
            for (id, (reference, in_force)) in &mut book.rentals {
                if *reference == of && named.as_ref().is_none_or(|r| r == id) && *in_force {
                    *in_force = false;
                    cancelled.push(id.clone());
                }
            }
            cancelled.sort();
            book.keys.insert(key.to_owned(), cancelled.clone());
            let outcome = if cancelled.is_empty() {
                Outcome::NothingToCancel
            } else {
                Outcome::Cancelled
            };
            (outcome, cancelled)
        },
    )
    .await?;
    Ok(Json(serde_json::json!({ "cancelled": rentals })))
}

/// A request on its way: it takes effect after its delay (`apply`, under the book's
/// lock, logged with the next sequence number) even if its client hangs up meanwhile,
/// as a request already sent would. The rentals it answers.
async fn arrive(
    shared: Arc<Shared>,
    key: String,
    op: &'static str,
    reference: String,
    apply: impl FnOnce(&mut Book, &str, &str) -> (Outcome, Vec<String>) + Send + 'static,
) -> Result<Vec<String>, (StatusCode, String)> {
    let landed = tokio::spawn(async move {
        travel(shared.seed, &key, op).await;
        let mut book = shared.book.lock().expect("not poisoned");
        let (outcome, rentals) = apply(&mut book, &key, &reference);
        let seq = book.log.len() as u64 + 1;
        book.log.push(Event {
            seq,
            op: op.into(),
            key,
            reference,
            outcome,
            rentals: rentals.clone(),
        });
        rentals
    });
    landed
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The service's client, as an agent uses it: each request carries the step's
/// idempotency key; what a failure means for the step is its `StepError`.
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:40123/v1`).
    ///
    /// # Errors
    /// Building the HTTP client.
    pub fn new(base: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .no_proxy()
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Reserves a car for `customer`; the rental's id.
    ///
    /// # Errors
    /// Retryable if the service could not be reached or failed (5xx, 429), fatal if it
    /// refused the request.
    pub async fn reserve(
        &self,
        key: &str,
        customer: u64,
        reference: &str,
    ) -> Result<String, StepError> {
        let body = ReserveBody {
            customer,
            reference: reference.to_owned(),
        };
        let rental: Rental = self.post("rentals", key, &body).await?;
        Ok(rental.rental_id)
    }

    /// Cancels the rental `rental_id` of `reference`, or (`None`: the reservation's
    /// outcome is unknown) every rental of it.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn cancel(
        &self,
        key: &str,
        reference: &str,
        rental_id: Option<&str>,
    ) -> Result<(), StepError> {
        let body = CancelBody {
            reference: reference.to_owned(),
            rental_id: rental_id.map(str::to_owned),
        };
        let _: serde_json::Value = self.post("rentals/cancel", key, &body).await?;
        Ok(())
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        body: &impl Serialize,
    ) -> Result<T, StepError> {
        let url = format!("{}/{path}", self.base);
        let response = self
            .http
            .post(&url)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .map_err(|e| StepError::retryable(format!("car rental API unreachable: {e}")))?;
        let status = response.status();
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(StepError::retryable(format!("car rental API: {status}")));
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(StepError::fatal(format!(
                "car rental API refused: {status} {text}"
            )));
        }
        response
            .json()
            .await
            .map_err(|e| StepError::retryable(format!("car rental API answer cut short: {e}")))
    }
}
