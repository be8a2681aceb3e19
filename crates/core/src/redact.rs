//! Database and NATS URLs as they may be printed: without their passwords or tokens.

/// `url` with every password in it replaced by `***`: the one in its user info
/// (`postgres://user:secret@host/db`, `nats://user:secret@host:4222`), a NATS URL's
/// token (its user info without a password, `nats://TOKEN@host`, also for `tls://`,
/// `ws://` and `wss://`), and those of its query string (`?password=secret`,
/// `sslpassword=…`: any parameter whose name holds `password`, `passwd` or `pwd`).
/// Each URL of a comma-separated list (`nats://a:p@h1,nats://b:p@h2`) is redacted.
/// For messages and logs: the CLI, the store's errors, the bench, the NATS link.
///
/// ```
/// use agentsaga_core::redact::redact_url;
/// assert_eq!(
///     redact_url("postgres://app:s3cret@db:5432/app?sslmode=require&password=s3cret"),
///     "postgres://app:***@db:5432/app?sslmode=require&password=***"
/// );
/// assert_eq!(redact_url("sqlite://app.db"), "sqlite://app.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let parts: Vec<&str> = url.split(',').collect();
    // A list of URLs, each with its scheme; a comma elsewhere (in a query's value, a
    // PostgreSQL URL's host list) stays in its URL.
    if parts.len() > 1 && parts.iter().all(|p| p.contains("://")) {
        return parts
            .iter()
            .map(|p| redact_one(p))
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(url)
}

/// One URL, redacted.
fn redact_one(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = redact_user_info(head);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_password(name) => format!("{name}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

/// `scheme://user:password@host…` with the password as `***`.
fn redact_user_info(head: &str) -> String {
    let Some((scheme, rest)) = head.split_once("://") else {
        return head.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            // NATS reads a user without a password as a token.
            None if ["nats", "tls", "ws", "wss"]
                .contains(&scheme.to_ascii_lowercase().as_str()) =>
            {
                format!("{scheme}://***@{host}{tail}")
            }
            None => head.to_owned(),
        },
        None => head.to_owned(),
    }
}

fn is_password(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "passwd", "pwd"]
        .iter()
        .any(|p| name.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        for (url, shown) in [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("sqlite://f.db", "sqlite://f.db"),
            ("sqlite://f.db?mode=rwc", "sqlite://f.db?mode=rwc"),
            (
                "postgres://u@h/db?password=secret",
                "postgres://u@h/db?password=***",
            ),
            (
                "postgres://h/db?user=u&PASSWORD=secret&sslmode=verify-full",
                "postgres://h/db?user=u&PASSWORD=***&sslmode=verify-full",
            ),
            (
                "postgresql://u:a@b@h/db?sslpassword=k&application_name=x",
                "postgresql://u:***@h/db?sslpassword=***&application_name=x",
            ),
            (
                "postgres://h/db?pwd=1&passwd=2",
                "postgres://h/db?pwd=***&passwd=***",
            ),
            ("no url at all", "no url at all"),
            (
                "nats://ops:secret@127.0.0.1:4222",
                "nats://ops:***@127.0.0.1:4222",
            ),
            ("nats://secret@h:4222", "nats://***@h:4222"),
            ("TLS://secret@h:4222", "TLS://***@h:4222"),
            ("nats://h:4222", "nats://h:4222"),
            (
                "nats://a:secret@h1:4222,tls://secret@h2:4222",
                "nats://a:***@h1:4222,tls://***@h2:4222",
            ),
            (
                "postgres://u:secret@h1,h2/db?password=secret,x",
                "postgres://u:***@h1,h2/db?password=***",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("secret"), "{url}");
        }
    }
}
