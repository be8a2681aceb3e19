//! How a process reaches a NATS server ([`NatsConnect`]): the server's URL, its
//! credentials (user and password, a token, a `.creds` file) and TLS, from the URL,
//! from setters or from the environment; shown only without its secrets.

use std::fmt;
use std::path::{Path, PathBuf};

use super::NatsError;

/// How to reach a NATS server: its URL and what a secured server asks for.
///
/// - **User and password**: in the URL (`nats://ops:s3cret@host:4222`, percent-encoded
///   where needed) or [`user_password`](Self::user_password).
/// - **Token**: the URL's user alone (`nats://TOKEN@host:4222`) or
///   [`token`](Self::token).
/// - **Credentials file** (NKey and JWT, a `.creds` file as `nsc` writes it):
///   [`credentials_file`](Self::credentials_file).
/// - **TLS**: a `tls://` URL, a server that requires it, or
///   [`require_tls`](Self::require_tls); the server's certificate is checked against
///   the system's roots or the CA of [`ca`](Self::ca); a client certificate for a
///   server that verifies clients: [`client_cert`](Self::client_cert).
///
/// [`from_env`](Self::from_env) reads the same from `AGENTSAGA_NATS_*` variables (see
/// the constants). Every secret stays out of what is shown: [`Display`](fmt::Display)
/// (and every error and log naming the server) gives the URL with its password or token
/// as `***`, and `Debug` shows no secret.
///
/// ```
/// use agentsaga_relay::nats::NatsConnect;
/// let to = NatsConnect::new("nats://ops:s3cret@127.0.0.1:4222");
/// assert_eq!(to.to_string(), "nats://ops:***@127.0.0.1:4222");
/// assert!(!format!("{to:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NatsConnect {
    /// The URL (or comma-separated URLs) without credentials: what the client dials.
    servers: String,
    /// The URL as given, redacted: what messages show.
    shown: String,
    user: Option<String>,
    password: Option<String>,
    token: Option<String>,
    creds: Option<PathBuf>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    tls: bool,
}

impl NatsConnect {
    /// The variable of the user name ([`from_env`](Self::from_env)).
    pub const ENV_USER: &str = "AGENTSAGA_NATS_USER";
    /// The variable of the password.
    pub const ENV_PASSWORD: &str = "AGENTSAGA_NATS_PASSWORD";
    /// The variable of the token.
    pub const ENV_TOKEN: &str = "AGENTSAGA_NATS_TOKEN";
    /// The variable of the path of a `.creds` file.
    pub const ENV_CREDS: &str = "AGENTSAGA_NATS_CREDS";
    /// The variable of the path of the CA certificates (PEM) the server's certificate
    /// is checked against.
    pub const ENV_CA: &str = "AGENTSAGA_NATS_CA";
    /// The variable of the path of the client certificate (PEM).
    pub const ENV_CERT: &str = "AGENTSAGA_NATS_CERT";
    /// The variable of the path of the client certificate's key (PEM).
    pub const ENV_KEY: &str = "AGENTSAGA_NATS_KEY";
    /// The variable that requires TLS when `1` or `true`.
    pub const ENV_TLS: &str = "AGENTSAGA_NATS_TLS";

    /// The server at `url` (`nats://127.0.0.1:4222`, `tls://…`, or several
    /// comma-separated), with the user and password, or the token, its user info
    /// holds.
    pub fn new(url: &str) -> Self {
        let mut to = Self {
            servers: String::new(),
            shown: agentsaga_core::redact::redact_url(url),
            user: None,
            password: None,
            token: None,
            creds: None,
            ca: None,
            cert: None,
            key: None,
            tls: false,
        };
        let mut servers = Vec::new();
        for part in url.split(',') {
            let part = part.trim();
            let (scheme, rest) = match part.split_once("://") {
                Some((scheme, rest)) => (Some(scheme), rest),
                None => (None, part),
            };
            let end = rest.find('/').unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            let host = match authority.rsplit_once('@') {
                Some((info, host)) => {
                    if to.user.is_none() && to.token.is_none() {
                        match info.split_once(':') {
                            Some((user, password)) => {
                                to.user = Some(decode(user));
                                to.password = Some(decode(password));
                            }
                            None => to.token = Some(decode(info)),
                        }
                    }
                    host
                }
                None => authority,
            };
            servers.push(match scheme {
                Some(scheme) => format!("{scheme}://{host}{tail}"),
                None => format!("{host}{tail}"),
            });
        }
        to.servers = servers.join(",");
        to
    }

    /// The server at `url` as [`new`](Self::new), then what the environment gives:
    /// [`ENV_USER`](Self::ENV_USER) and [`ENV_PASSWORD`](Self::ENV_PASSWORD),
    /// [`ENV_TOKEN`](Self::ENV_TOKEN), [`ENV_CREDS`](Self::ENV_CREDS),
    /// [`ENV_CA`](Self::ENV_CA), [`ENV_CERT`](Self::ENV_CERT) and
    /// [`ENV_KEY`](Self::ENV_KEY), [`ENV_TLS`](Self::ENV_TLS). A variable set (and not
    /// empty) takes the place of what the URL says.
    pub fn from_env(url: &str) -> Self {
        Self::new(url).with_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// What `var` gives for the `AGENTSAGA_NATS_*` names, over what is set.
    fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(user) = var(Self::ENV_USER) {
            self.user = Some(user);
            self.password = var(Self::ENV_PASSWORD).or(self.password);
        } else if let Some(password) = var(Self::ENV_PASSWORD) {
            self.password = Some(password);
        }
        if let Some(token) = var(Self::ENV_TOKEN) {
            self.token = Some(token);
        }
        let path = |name| var(name).map(PathBuf::from);
        self.creds = path(Self::ENV_CREDS).or(self.creds);
        self.ca = path(Self::ENV_CA).or(self.ca);
        self.cert = path(Self::ENV_CERT).or(self.cert);
        self.key = path(Self::ENV_KEY).or(self.key);
        if let Some(tls) = var(Self::ENV_TLS) {
            self.tls = matches!(tls.to_ascii_lowercase().as_str(), "1" | "true" | "yes");
        }
        self
    }

    /// Authenticates with `user` and `password` (in place of the URL's).
    #[must_use]
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Authenticates with `token` (in place of the URL's).
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Authenticates with the user JWT and NKey seed of the `.creds` file at `path`
    /// (read when connecting).
    #[must_use]
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.creds = Some(path.into());
        self
    }

    /// Checks the server's certificate against the CA certificates (PEM) at `path`
    /// instead of the system's roots, and requires TLS.
    #[must_use]
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Presents the client certificate at `cert` with its key at `key` (both PEM) to
    /// a server that verifies its clients, and requires TLS.
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// Refuses a connection without TLS when `required` (a `tls://` URL, a CA or a
    /// client certificate require it too).
    #[must_use]
    pub fn require_tls(mut self, required: bool) -> Self {
        self.tls = required;
        self
    }

    /// The URL as it may be shown: its password or token as `***`.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A client connected as configured.
    ///
    /// # Errors
    /// [`NatsError::Credentials`] for a `.creds`, CA, certificate or key file that
    /// cannot be read or used; [`NatsError::Config`] for a client certificate without
    /// its key or a key without its certificate; [`NatsError::Connect`] if the server
    /// cannot be reached, refuses the credentials or the TLS handshake fails (the URL
    /// it names redacted).
    pub async fn client(&self) -> Result<async_nats::Client, NatsError> {
        let mut options = async_nats::ConnectOptions::new();
        if let Some(path) = &self.creds {
            check_file("credentials file", path)?;
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| NatsError::Credentials {
                    what: "credentials file",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
        }
        if let Some(user) = &self.user {
            let password = self.password.clone().unwrap_or_default();
            options = options.user_and_password(user.clone(), password);
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(ca) = &self.ca {
            check_file("CA file", ca)?;
            options = options.add_root_certificates(ca.clone());
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                check_file("client certificate", cert)?;
                check_file("client key", key)?;
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            _ => {
                return Err(NatsError::Config(format!(
                    "a NATS client certificate needs its key and a key its certificate \
                     ({} and {})",
                    Self::ENV_CERT,
                    Self::ENV_KEY
                )));
            }
        }
        if self.tls || self.ca.is_some() || self.cert.is_some() {
            options = options.require_tls(true);
        }
        options
            .connect(self.servers.as_str())
            .await
            .map_err(|source| NatsError::Connect {
                url: self.shown.clone(),
                source,
            })
    }
}

/// `path` is a file this process can read, or why not.
fn check_file(what: &'static str, path: &Path) -> Result<(), NatsError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| NatsError::Credentials {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// `s` with its `%XX` escapes decoded (as a URL's user info is written).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(Some(hi)), Some(Some(lo))) = (
                bytes.get(i + 1).map(|b| hex(*b)),
                bytes.get(i + 2).map(|b| hex(*b)),
            )
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Display for NatsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for NatsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("NatsConnect")
            .field("url", &self.shown)
            .field("user", &self.user)
            .field("password", &secret(&self.password))
            .field("token", &secret(&self.token))
            .field("credentials_file", &self.creds)
            .field("ca", &self.ca)
            .field("client_cert", &self.cert)
            .field("client_key", &self.key)
            .field("require_tls", &self.tls)
            .finish()
    }
}

impl From<&str> for NatsConnect {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<&String> for NatsConnect {
    fn from(url: &String) -> Self {
        Self::new(url)
    }
}

impl From<String> for NatsConnect {
    fn from(url: String) -> Self {
        Self::new(&url)
    }
}

impl From<&NatsConnect> for NatsConnect {
    fn from(to: &NatsConnect) -> Self {
        to.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_gives_user_and_password_or_a_token() {
        let to = NatsConnect::new("nats://ops:s%40cret@127.0.0.1:4222");
        assert_eq!(to.servers, "nats://127.0.0.1:4222");
        assert_eq!(to.user.as_deref(), Some("ops"));
        assert_eq!(to.password.as_deref(), Some("s@cret"));
        assert_eq!(to.to_string(), "nats://ops:***@127.0.0.1:4222");

        let to = NatsConnect::new("tls://T0KEN@a:4222,tls://T0KEN@b:4222");
        assert_eq!(to.servers, "tls://a:4222,tls://b:4222");
        assert_eq!(to.token.as_deref(), Some("T0KEN"));
        assert!(!to.to_string().contains("T0KEN"), "{to}");

        let to = NatsConnect::new("127.0.0.1:4222");
        assert_eq!(to.servers, "127.0.0.1:4222");
        assert_eq!((to.user, to.token), (None, None));
    }

    #[test]
    fn the_environment_takes_the_place_of_the_url() {
        let vars = |name: &str| {
            Some(match name {
                NatsConnect::ENV_USER => "env-user".to_owned(),
                NatsConnect::ENV_PASSWORD => "env-s3cret".to_owned(),
                NatsConnect::ENV_TOKEN => "env-token".to_owned(),
                NatsConnect::ENV_CREDS => "/etc/nats/app.creds".to_owned(),
                NatsConnect::ENV_CA => "/etc/nats/ca.pem".to_owned(),
                NatsConnect::ENV_TLS => "true".to_owned(),
                _ => return None,
            })
        };
        let to = NatsConnect::new("nats://ops:s3cret@h:4222").with_vars(vars);
        assert_eq!(to.user.as_deref(), Some("env-user"));
        assert_eq!(to.password.as_deref(), Some("env-s3cret"));
        assert_eq!(to.token.as_deref(), Some("env-token"));
        assert_eq!(to.creds, Some(PathBuf::from("/etc/nats/app.creds")));
        assert_eq!(to.ca, Some(PathBuf::from("/etc/nats/ca.pem")));
        assert!(to.tls);
        let debug = format!("{to:?}");
        for secret in ["s3cret", "env-token"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        // Nothing set: the URL's.
        let to = NatsConnect::new("nats://ops:s3cret@h:4222").with_vars(|_| None);
        assert_eq!(to.password.as_deref(), Some("s3cret"));
    }
}
