//! Reads the Prometheus endpoint as a test would: one `GET /metrics`, the samples by
//! name (labels included).

use std::collections::HashMap;
use std::io::{Read, Write};

/// The samples `GET /metrics` on `addr` serves, by series (with its labels).
pub(crate) fn scrape(addr: std::net::SocketAddr) -> HashMap<String, f64> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}
