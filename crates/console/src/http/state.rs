//! What every handler gets: the console and the router's configuration (its tokens,
//! and what each may do).

use std::sync::Arc;

use crate::Console;

/// How the router is served: tokens, links.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Bearer token that may read (status, lists, one saga, dead letters).
    pub read_token: Option<String>,
    /// Bearer token that may read and act (abort, retry, skip, signal, raise a
    /// budget, pause, resume and rewind a saga, redrive, purge, start, and write
    /// schedules).
    pub action_token: Option<String>,
    /// Base URL of Jaeger's UI, for the link to a saga's trace (e.g.
    /// `http://127.0.0.1:16686`).
    pub jaeger_url: Option<String>,
    /// Host names the console is reached by, besides IP addresses and `localhost`
    /// (e.g. `console.internal`; a port, if given, is ignored). A request whose `Host`
    /// is none of them is refused with 421: a page whose name was rebound to this
    /// address (DNS rebinding) cannot read or act.
    pub allowed_hosts: Vec<String>,
}

impl HttpConfig {
    /// Whether any token is configured (then every request needs one).
    pub fn requires_token(&self) -> bool {
        self.read_token.is_some() || self.action_token.is_some()
    }

    /// What `token` may do: [`Access::Act`] for the action token, [`Access::Read`] for
    /// the read token, `None` for anything else (an empty token matches nothing).
    /// Compared in constant time.
    pub(crate) fn access(&self, token: &str) -> Option<Access> {
        let act = self
            .action_token
            .as_deref()
            .is_some_and(|t| same(t.as_bytes(), token.as_bytes()));
        let read = self
            .read_token
            .as_deref()
            .is_some_and(|t| same(t.as_bytes(), token.as_bytes()));
        if token.is_empty() {
            None
        } else if act {
            Some(Access::Act)
        } else if read {
            Some(Access::Read)
        } else {
            None
        }
    }
}

/// What a request may do, as the token check decided; in every request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// No token is configured: everything.
    Open,
    /// The read token: `GET` only.
    Read,
    /// The action token: everything.
    Act,
}

impl Access {
    /// Whether the request may act (anything but `GET` and `HEAD`).
    pub(crate) fn may_act(self) -> bool {
        self != Access::Read
    }
}

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) console: Console,
    pub(crate) config: Arc<HttpConfig>,
}

/// Equal, in time that depends only on the lengths.
fn same(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = expected.len() ^ given.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(e ^ given.get(i).copied().unwrap_or(0));
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let c = HttpConfig {
            read_token: Some("r34d".into()),
            action_token: Some("4ct".into()),
            ..HttpConfig::default()
        };
        assert_eq!(c.access("4ct"), Some(Access::Act));
        assert_eq!(c.access("r34d"), Some(Access::Read));
        for wrong in ["", "4c", "4ctt", "r34", "R34D", "x"] {
            assert_eq!(c.access(wrong), None, "{wrong}");
        }
        let empty = HttpConfig {
            action_token: Some(String::new()),
            ..HttpConfig::default()
        };
        assert!(empty.requires_token());
        assert_eq!(empty.access(""), None, "an empty token matches nothing");
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab") && !same(b"", b"a"));
    }
}
