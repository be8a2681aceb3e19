//! The page's one stylesheet and one small script, served from this origin (the
//! Content-Security-Policy allows no other script, and no inline one).

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

pub(crate) async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

pub(crate) async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

pub(crate) async fn icon() -> Response {
    asset("image/svg+xml", ICON)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    super::html::secure(h);
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A saga's bars, as the tab's icon.
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#1d2330\"/>\
<rect x=\"2\" y=\"3\" width=\"7\" height=\"2.5\" fill=\"#23904f\"/>\
<rect x=\"6\" y=\"7\" width=\"6\" height=\"2.5\" fill=\"#23904f\"/>\
<rect x=\"9\" y=\"11\" width=\"5\" height=\"2.5\" fill=\"#14808a\"/></svg>";

/// Asks `confirm()` before any form with `data-confirm` is sent; re-fetches the element
/// with `data-live` (a URL of a fragment) every 2 s and shows whether that works.
const JS: &str = r#"(function () {
  'use strict';
  document.addEventListener('submit', function (e) {
    var question = e.target.getAttribute('data-confirm');
    if (question && !window.confirm(question)) {
      e.preventDefault();
    }
  });
  var live = document.querySelector('[data-live]');
  if (!live) return;
  var url = live.getAttribute('data-live');
  var badge = document.getElementById('live');
  function say(text, ok) {
    if (badge) {
      badge.textContent = text;
      badge.className = ok ? 'live ok' : 'live bad';
    }
  }
  function tick() {
    fetch(url, { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        if (!r.ok) throw new Error('HTTP ' + r.status);
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        say('live · ' + new Date().toLocaleTimeString(), true);
      })
      .catch(function (err) {
        say('not updating (' + err.message + ')', false);
      })
      .then(function () {
        window.setTimeout(tick, 2000);
      });
  }
  say('live', true);
  window.setTimeout(tick, 2000);
})();
"#;

const CSS: &str = r#":root {
  --fg: #1d2330; --muted: #6b7385; --line: #dde1e8; --bg: #f6f7f9; --card: #fff;
  --blue: #2f6fdb; --green: #23904f; --red: #c93434; --amber: #b87a00; --violet: #7b4bc4;
  --grey: #7d8597; --teal: #14808a;
}
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); }
a { color: var(--blue); text-decoration: none; }
a:hover { text-decoration: underline; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
header.top { display: flex; align-items: center; gap: 2rem; padding: .6rem 1.5rem;
  background: #1d2330; color: #fff; }
header.top .brand { color: #fff; font-weight: 700; font-size: 16px; letter-spacing: .02em; }
header.top nav a { color: #c9d1e0; margin-right: 1.2rem; }
header.top nav a[aria-current="page"] { color: #fff; font-weight: 600; }
main { padding: 1.2rem 1.5rem 3rem; max-width: 1280px; }
h1 { font-size: 20px; margin: .2rem 0 1rem; display: flex; align-items: center; gap: .6rem; flex-wrap: wrap; }
h2 { font-size: 15px; margin: 1.6rem 0 .6rem; }
.muted { color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: .7rem; margin-bottom: .8rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .7rem .9rem; }
.card a { color: inherit; display: block; }
.card a:hover { text-decoration: none; }
.card .num { display: block; font-size: 24px; font-weight: 650; }
.card .label { color: var(--muted); }
.card.warn { border-color: var(--amber); }
.card.bad { border-color: var(--red); }
.card.bad .num { color: var(--red); }
.card.warn .num { color: var(--amber); }
.live { font-size: 12px; padding: .1rem .5rem; border-radius: 999px; font-weight: 500; }
.live.ok { background: #e3f4ea; color: var(--green); }
.live.bad { background: #fbe5e5; color: var(--red); }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef0f4; font-weight: 600; font-size: 12.5px; }
td.err, .err { color: var(--red); }
.badge { display: inline-block; padding: .05rem .55rem; border-radius: 999px; font-size: 12px;
  font-weight: 600; color: #fff; background: var(--grey); }
.st-running { background: var(--blue); } .st-compensating { background: var(--amber); }
.st-stuck { background: var(--red); } .st-completed { background: var(--green); }
.st-compensated { background: var(--teal); } .st-aborted { background: var(--grey); }
.st-active { background: var(--green); } .st-paused { background: var(--amber); }
form.filters { display: flex; gap: .8rem; align-items: end; flex-wrap: wrap; margin-bottom: 1rem;
  background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .7rem .9rem; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: .2rem; }
form.filters label.check { flex-direction: row; align-items: center; color: var(--fg); font-size: 14px; }
input, select, button { font: inherit; }
input[type=text], select { padding: .25rem .4rem; border: 1px solid var(--line); border-radius: 5px; min-width: 10rem; }
button { padding: .3rem .9rem; border-radius: 6px; border: 1px solid var(--blue); background: var(--blue);
  color: #fff; cursor: pointer; }
button.danger { background: var(--red); border-color: var(--red); }
button.quiet { background: #fff; color: var(--fg); border-color: var(--line); }
.actions { display: flex; gap: .6rem; align-items: center; margin: .6rem 0 1rem; flex-wrap: wrap; }
.actions form { margin: 0; }
.notice { padding: .55rem .8rem; border-radius: 6px; margin: .4rem 0 1rem; }
.notice.ok { background: #e3f4ea; border: 1px solid #b6e0c6; }
.notice.bad { background: #fbe5e5; border: 1px solid #f0b9b9; }
.notice.warn { background: #fdf3dc; border: 1px solid #f0d79a; }
.rewinds { margin: .2rem 0 1rem; padding-left: 1.2rem; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; margin: 0 0 1rem;
  background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .7rem .9rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
pre.json { background: #1d2330; color: #e6e9ef; padding: .8rem 1rem; border-radius: 8px; overflow: auto; max-height: 32rem; margin: 0; }
.timeline { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: .5rem .9rem .8rem; }
.tl-row { display: grid; grid-template-columns: 17rem 1fr 6.5rem; gap: .8rem; align-items: center; padding: .2rem 0; }
.tl-head { font-size: 12px; color: var(--muted); border-bottom: 1px solid var(--line); }
.tl-section { font-weight: 600; font-size: 12.5px; padding: .6rem 0 .1rem; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
.tl-label { overflow: hidden; }
.tl-label .name { font-weight: 600; }
.tl-label .sub { color: var(--muted); font-size: 12px; }
.tl-label .err { font-size: 12px; display: block; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.tl-track { position: relative; height: 1.4rem; border-radius: 4px;
  background: repeating-linear-gradient(to right, #f0f2f5 0, #f0f2f5 calc(25% - 1px), #e2e5ea calc(25% - 1px), #e2e5ea 25%); }
.tl-bar { position: absolute; top: .2rem; bottom: .2rem; min-width: 4px; border-radius: 3px; background: var(--grey); }
.tl-bar.succeeded { background: var(--green); }
.tl-bar.failed { background: var(--red); }
.tl-bar.dispatched, .tl-bar.open { background: repeating-linear-gradient(45deg, var(--blue) 0 6px, #5b8fe6 6px 12px); }
.tl-bar.wait { background: var(--violet); }
.tl-bar.wait.dispatched { background: repeating-linear-gradient(45deg, var(--violet) 0 6px, #9b78d6 6px 12px); }
.tl-bar.comp { background: var(--amber); }
.tl-bar.comp.done { background: var(--teal); }
.tl-bar.comp.skipped { background: var(--grey); }
.tl-bar.comp.failed { background: var(--red); }
.tl-bar.comp.dispatched { background: repeating-linear-gradient(45deg, var(--amber) 0 6px, #d7a640 6px 12px); }
.tl-dur { font-size: 12px; color: var(--muted); text-align: right; }
.tl-axis { display: flex; justify-content: space-between; font-size: 11.5px; color: var(--muted); }
.legend { display: flex; gap: 1rem; flex-wrap: wrap; font-size: 12px; color: var(--muted); margin-top: .5rem; }
.legend i.tl-bar { position: static; display: inline-block; width: .9rem; height: .6rem; min-width: 0;
  margin-right: .3rem; vertical-align: middle; }
td time, .nowrap { white-space: nowrap; }
.late { color: var(--amber); font-size: 12.5px; }
.small { font-size: 12.5px; }
td.last-error { min-width: 14rem; }
details summary { cursor: pointer; color: var(--blue); }
.pager { margin-top: .8rem; }
"#;
