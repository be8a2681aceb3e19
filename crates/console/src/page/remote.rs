//! The overview's section on remote destinations (only on a console with a broker to
//! read): the broker's figures for each consumer beside this database's rows waiting.

use std::fmt::Write as _;

use super::html::esc;
use crate::ops::RemoteList;

/// `<h2>Remote destinations</h2>` and its table, or why the broker was not read.
pub(crate) fn section(r: &RemoteList) -> String {
    let mut out = format!(
        "<h2>Remote destinations</h2>\n<p class=\"muted\">Broker: {}</p>\n",
        esc(&r.broker)
    );
    if let Some(e) = &r.error {
        let _ = writeln!(
            out,
            "<p class=\"notice bad\" role=\"alert\" id=\"remote-error\">Broker {}: its figures are missing; this database's are below.</p>",
            esc(e)
        );
    }
    if r.destinations.is_empty() {
        if r.error.is_none() {
            out += "<p class=\"muted\">No consumer on the broker, no destination declared remote.</p>\n";
        }
        return out;
    }
    out += "<table id=\"remote\">\n<thead><tr><th>Destination</th><th>Consumer</th>\
            <th>Broker pending</th><th>In the service's hands</th><th>Redelivered</th>\
            <th>Outbox pending</th><th>Outbox in flight</th><th>Waiting for the broker</th></tr></thead>\n<tbody>\n";
    let n = |v: Option<u64>| v.map_or_else(|| "–".to_owned(), |v| v.to_string());
    for d in &r.destinations {
        let _ = writeln!(
            out,
            "<tr data-destination=\"{dest}\"><td class=\"mono\">{dest}</td><td class=\"mono\">{consumer}</td>\
             <td data-count=\"pending\">{pending}</td><td data-count=\"ack_pending\">{ack}</td>\
             <td data-count=\"redelivered\">{redelivered}</td><td data-count=\"outbox_pending\">{op}</td>\
             <td data-count=\"outbox_in_flight\">{of}</td>{away}</tr>",
            dest = esc(&d.destination),
            consumer = esc(d.consumer.as_deref().unwrap_or("none")),
            pending = n(d.pending),
            ack = n(d.ack_pending),
            redelivered = n(d.redelivered),
            op = d.outbox_pending,
            of = d.outbox_in_flight,
            away = match &d.unavailable {
                Some(why) if d.outbox_unavailable > 0 => format!(
                    "<td data-count=\"outbox_unavailable\" class=\"err\" title=\"{}\">{} (unreachable: no attempt spent)</td>",
                    esc(why),
                    d.outbox_unavailable
                ),
                _ => "<td data-count=\"outbox_unavailable\">0</td>".to_owned(),
            },
        );
    }
    out += "</tbody>\n</table>\n";
    out
}
