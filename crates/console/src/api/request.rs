//! What a request says: its query parameters, the ids in its path, its body, each
//! checked before anything is read or written (a 400, or a 413 for a body over
//! [`MAX_BODY`]).

use std::collections::BTreeMap;

use agentsaga_core::MessageId;
use agentsaga_saga::{SagaId, SagaState};
use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::error::ApiError;
use crate::ops;

/// The largest request body the API reads: 64 KiB. A larger one is a 413.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The parameters `GET /sagas` takes.
pub(super) const SAGA_PARAMS: &[&str] = &[
    "state", "name", "key", "waiting", "sleeping", "stalled", "from", "to", "cursor", "limit",
    "parent",
];

/// The query parameters of one request: each at most once, each one the endpoint
/// knows; an empty value counts as absent.
pub(super) struct Params(BTreeMap<String, String>);

impl Params {
    pub(super) fn parse(raw: Option<String>, known: &[&str]) -> Result<Self, ApiError> {
        let mut params = BTreeMap::new();
        for pair in raw.as_deref().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (percent_decode(k)?, percent_decode(v)?);
            if !known.contains(&k.as_str()) {
                return Err(ApiError::invalid(if known.is_empty() {
                    format!("unknown parameter `{k}`: this endpoint takes none")
                } else {
                    format!(
                        "unknown parameter `{k}`: this endpoint takes {}",
                        known.join(", ")
                    )
                }));
            }
            if params.insert(k.clone(), v).is_some() {
                return Err(ApiError::invalid(format!("parameter `{k}` given twice")));
            }
        }
        params.retain(|_, v: &mut String| !v.is_empty());
        Ok(Self(params))
    }

    pub(super) fn string(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }

    pub(super) fn value<T>(
        &self,
        k: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ApiError> {
        self.0
            .get(k)
            .map(|v| parse(v).map_err(|e| ApiError::invalid(format!("parameter `{k}`: {e}"))))
            .transpose()
    }

    pub(super) fn flag(&self, k: &str) -> Result<bool, ApiError> {
        Ok(self.value(k, parse_bool)?.unwrap_or(false))
    }
}

pub(super) fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("`{v}` is not true or false")),
    }
}

pub(super) fn parse_limit(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if (1..=ops::MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(format!("`{v}` is not a number from 1 to {}", ops::MAX_PAGE)),
    }
}

pub(super) fn parse_parent(v: &str) -> Result<SagaId, String> {
    ops::parse_saga_id(v).map_err(|e| format!("parent: {e}"))
}

pub(super) fn parse_state(v: &str) -> Result<SagaState, String> {
    v.parse().map_err(|_| {
        format!(
            "unknown saga state `{v}`: expected one of running, compensating, stuck, \
             completed, compensated, aborted"
        )
    })
}

/// `%XX` and `+` decoded, as in a query string.
pub(super) fn percent_decode(s: &str) -> Result<String, ApiError> {
    crate::http::encoding::percent_decode(s)
        .ok_or_else(|| ApiError::invalid(format!("malformed query string near `{s}`")))
}

pub(super) fn saga_id(path: Result<Path<String>, PathRejection>) -> Result<SagaId, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(ops::parse_saga_id(&id)?)
}

pub(super) fn message_id(path: Result<Path<String>, PathRejection>) -> Result<MessageId, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(ops::parse_message_id(&id)?)
}

/// The body as JSON of type `T`; an empty body is `T::default()` when `empty` allows it.
pub(super) fn body<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
    empty: Option<fn() -> T>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is over the limit of {MAX_BODY} bytes"),
            )
        } else {
            ApiError::invalid(format!("cannot read the body: {}", e.body_text()))
        }
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        if let Some(default) = empty {
            return Ok(default());
        }
        return Err(ApiError::invalid(
            "the body is empty: a JSON object is expected",
        ));
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("malformed body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "malformed body: a JSON object is expected",
        ));
    }
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("malformed body: {e}")))
}

/// A point in time as `from` / `to` take it: Unix milliseconds (`1732281777111`) or RFC
/// 3339 (`2024-11-22T13:22:57Z`, `2024-11-22T13:22:57.111+01:00`).
pub(super) fn parse_time(v: &str) -> Result<i64, String> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v
            .parse()
            .map_err(|_| format!("`{v}` is out of range for Unix milliseconds"));
    }
    crate::time::parse_rfc3339(v).ok_or_else(|| {
        format!(
            "`{v}` is neither Unix milliseconds nor an RFC 3339 timestamp \
             (2024-11-22T13:22:57Z)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::rfc3339;

    #[test]
    fn times() {
        assert_eq!(parse_time("1732281777111"), Ok(1_732_281_777_111));
        assert_eq!(
            parse_time("2024-11-22T13:22:57.111Z"),
            Ok(1_732_281_777_111)
        );
        assert_eq!(parse_time("2024-11-22T13:22:57Z"), Ok(1_732_281_777_000));
        assert_eq!(
            parse_time("2024-11-22T14:22:57.1+01:00"),
            Ok(1_732_281_777_100)
        );
        assert_eq!(
            parse_time("2024-11-22T13:22:57.111999Z"),
            Ok(1_732_281_777_111)
        );
        assert_eq!(parse_time("2000-02-29T00:00:00.000Z"), Ok(951_782_400_000));
        for ms in [0, 951_782_400_000, 1_732_281_777_111, 4_102_444_800_123] {
            assert_eq!(parse_time(&rfc3339(ms)), Ok(ms));
        }
        for bad in [
            "",
            "yesterday",
            "2024-11-22",
            "2024-11-22T13:22:57",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-11-22T13:22:57.Z",
            "2024-11-22T13:22:57+1:00",
            "2024-11-22T13:22:57+-1:00",
            "2024-11-22T13:22:57+24:00",
            "+2024-11-22T13:22:57Z",
            "-5",
            "99999999999999999999",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_and_values() {
        assert_eq!(parse_limit("1"), Ok(1));
        assert_eq!(parse_limit("1000"), Ok(1000));
        for bad in ["0", "1001", "x", "-1", ""] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("yes").is_err());
    }

    #[test]
    fn params() {
        let p = Params::parse(Some("name=a+b%2Fc&state=&limit=5".into()), SAGA_PARAMS).unwrap();
        assert_eq!(p.string("name").as_deref(), Some("a b/c"));
        assert_eq!(p.string("state"), None, "an empty value is absent");
        assert!(Params::parse(Some("bogus=1".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=a&name=b".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=%zz".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(Some("name=%e9".into()), SAGA_PARAMS).is_err());
        assert!(Params::parse(None, &[]).is_ok());
        assert!(Params::parse(Some("x".into()), &[]).is_err());
    }
}
