#!/usr/bin/env python3
"""A `payments` agent in Python that serves an agentsaga saga over NATS JetStream.

It follows docs/remote.md ("The wire format, for a service in another language"), with
`nats-py` and the standard library's `sqlite3` only:
- a durable pull consumer on `agentsaga.payments` (stream `AGENTSAGA`), explicit acks;
- per command, ONE transaction of its own SQLite file: the id into `inbox` (a repeat
  is skipped but acknowledged), the effect into `effects`, the reply (a fresh id,
  written once) into `outbox`; commit, then acknowledge;
- a publisher of the outbox in order to `agentsaga.<reply_to>`, `Nats-Msg-Id` = the
  reply's id, a row marked published only on the stream's acknowledgement;
- input it cannot serve: logged with the reason, kept in `dead`, terminated.

Run: python payments.py --nats nats://127.0.0.1:4222 --db payments.db
(a secured broker: `nats://USER:PASSWORD@host` or the AGENTSAGA_NATS_* variables)
It prints `ready` once it consumes; SIGTERM or SIGINT stops it cleanly.
Tested by crates/runtime/tests/remote/python.rs.
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import ssl
import sys
import time
import uuid

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

DESTINATION = "payments"
STREAM = "AGENTSAGA"
PREFIX = "agentsaga"

SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (message_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS effects (saga TEXT NOT NULL, effect TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE, destination TEXT NOT NULL, headers TEXT NOT NULL,
    payload TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
    published INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS dead (stream_seq INTEGER PRIMARY KEY, reason TEXT NOT NULL,
    body TEXT NOT NULL);
"""


def log(text):
    print(f"payments.py: {text}", file=sys.stderr, flush=True)


class Malformed(Exception):
    """Input this agent cannot serve; its text is the reason."""


def parse(body):
    """The command envelope in `body`, checked, or Malformed with the reason."""
    try:
        env = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"the body is not JSON: {e}") from None
    if not isinstance(env, dict):
        raise Malformed("the envelope is not a JSON object")
    try:
        uuid.UUID(str(env.get("id")))
    except ValueError:
        raise Malformed(f"the envelope's id {env.get('id')!r} is not a UUID") from None
    if env.get("destination") != DESTINATION:
        raise Malformed(f"the envelope's destination {env.get('destination')!r} is not ours")
    headers = env.get("headers")
    if not isinstance(headers, dict):
        raise Malformed("the envelope has no headers object")
    if headers.get("kind") not in ("command", "compensate"):
        raise Malformed(f"kind {headers.get('kind')!r} is neither command nor compensate")
    for name in ("reply_to", "saga_id", "step", "step_name"):
        if not isinstance(headers.get(name), str) or not headers[name]:
            raise Malformed(f"the {headers['kind']} has no {name} header")
    try:
        json.loads(env.get("payload"))
    except (TypeError, json.JSONDecodeError):
        raise Malformed("the envelope's payload is not JSON text") from None
    return env


class Payments:
    """The agent: its database, and what it does with one command."""

    def __init__(self, path):
        # Autocommit mode: every transaction is an explicit BEGIN … COMMIT below.
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.wake = asyncio.Event()  # set when the outbox has something new

    @contextlib.contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def handle(self, env):
        """Inbox, effect and reply in one transaction; False if a repeat."""
        headers = env["headers"]
        undo = headers["kind"] == "compensate"
        reply_headers = {"kind": "reply", "causation_id": env["id"],
                         **{h: headers[h] for h in ("saga_id", "step", "step_name")}}
        with self.transaction() as db:
            seen = db.execute(
                "INSERT INTO inbox (message_id) VALUES (?) ON CONFLICT DO NOTHING", (env["id"],)
            ).rowcount == 0
            if not seen:
                effect = "payments/undo" if undo else "payments/do"
                db.execute(
                    "INSERT INTO effects (saga, effect) VALUES (?, ?)",
                    (headers["saga_id"], effect),
                )
                db.execute(
                    "INSERT INTO outbox (id, destination, headers, payload, created_at_ms)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (str(uuid.uuid4()), headers["reply_to"], json.dumps(reply_headers),
                     json.dumps({"ok": {"by": "payments"}}), int(time.time() * 1000)),
                )
        if not seen:
            self.wake.set()
        return not seen

    def dead(self, stream_seq, reason, body):
        """Keeps input it cannot serve, with the reason (a redelivery is kept once)."""
        log(f"dead letter (stream seq {stream_seq}): {reason}")
        with self.transaction() as db:
            db.execute(
                "INSERT INTO dead (stream_seq, reason, body) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (stream_seq, reason, body.decode("utf-8", "replace")),
            )

    def unpublished(self):
        return self.db.execute(
            "SELECT seq, id, destination, headers, payload, created_at_ms FROM outbox"
            " WHERE published = 0 ORDER BY seq LIMIT 100"
        ).fetchall()

    def published(self, seq):
        self.db.execute("UPDATE outbox SET published = 1 WHERE seq = ?", (seq,))


async def consume(agent, js, args, stop):
    """Takes commands from the durable consumer, one transaction each, until `stop`."""
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=args.ack_wait, max_deliver=-1
    )
    sub = await js.pull_subscribe(
        f"{PREFIX}.{DESTINATION}", durable=args.durable, stream=STREAM, config=config
    )
    print("ready", flush=True)
    handled = 0
    while not stop.is_set():
        try:
            batch = await sub.fetch(batch=10, timeout=1)
        except (NatsTimeout, asyncio.TimeoutError):  # nothing new within a second
            continue
        except Exception as e:  # the server away: the client reconnects
            log(f"fetch failed, will retry: {e!r}")
            await asyncio.sleep(0.5)
            continue
        for msg in batch:
            try:
                env = parse(msg.data)
            except Malformed as why:
                agent.dead(msg.metadata.sequence.stream, str(why), msg.data)
                await msg.term()
                continue
            try:
                fresh = agent.handle(env)
            except sqlite3.Error as e:  # nothing was written: handed back, tried again
                log(f"message {env['id']} not stored, handed back: {e!r}")
                await msg.nak(delay=1)
                continue
            if not fresh:
                log(f"message {env['id']} is a repeat: acknowledged, not applied again")
            handled += 1
            if handled == args.crash_before_ack:
                # For tests: die like `kill -9` between the commit and the ack.
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                await msg.ack_sync()
            except Exception as e:  # it comes back, and the inbox knows it
                log(f"acknowledgement of {env['id']} not confirmed: {e!r}")


async def publish(agent, js, stop):
    """Publishes the outbox's rows in order, each until the stream acknowledges it."""
    while not stop.is_set():
        agent.wake.clear()
        rows = agent.unpublished()
        if not rows:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(agent.wake.wait(), timeout=1)
            continue
        for seq, id_, destination, headers, payload, created in rows:
            header_map = json.loads(headers)
            # seq, attempts, created_at_ms: the sender's bookkeeping, required fields.
            envelope = {"seq": seq, "id": id_, "destination": destination, "key": None,
                        "payload": payload, "headers": header_map, "attempts": 1,
                        "created_at_ms": created}
            try:
                await js.publish(
                    f"{PREFIX}.{destination}",
                    json.dumps(envelope).encode(),
                    stream=STREAM,
                    headers={**header_map, "Nats-Msg-Id": id_},
                )
            except Exception as e:  # not acknowledged: the same row again, later
                log(f"publishing reply {id_} failed, will retry: {e!r}")
                await asyncio.sleep(0.5)
                break
            agent.published(seq)


def secured():
    """What a secured broker asks for, from agentsaga's variables (docs/remote.md): user
    and password, token, a .creds file, TLS with a CA and a client certificate. A URL's
    `user:password@` or `token@` nats-py reads itself. Never printed."""
    def env(name):
        return os.environ.get(f"AGENTSAGA_NATS_{name}") or None
    options = {}
    if env("USER"):
        options.update(user=env("USER"), password=env("PASSWORD") or "")
    if env("TOKEN"):
        options["token"] = env("TOKEN")
    if env("CREDS"):
        options["user_credentials"] = env("CREDS")
    if env("CA") or env("CERT") or (env("TLS") or "").lower() in ("1", "true", "yes"):
        tls = ssl.create_default_context(cafile=env("CA"))
        if env("CERT"):
            tls.load_cert_chain(env("CERT"), env("KEY"))
        options["tls"] = tls
    return options


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument("--db", required=True, help="this agent's SQLite file")
    parser.add_argument("--durable", default="python-payments", help="the consumer's name")
    parser.add_argument("--ack-wait", type=float, default=30.0,
                        help="seconds before the server delivers an unacknowledged message again")
    parser.add_argument("--crash-before-ack", type=int, default=0, metavar="N",
                        help="for tests: SIGKILL itself after the Nth commit, before its ack")
    args = parser.parse_args()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    agent = Payments(args.db)
    nc = await nats.connect(args.nats, max_reconnect_attempts=-1, **secured())
    js = nc.jetstream()
    try:
        await js.stream_info(STREAM)
    except NotFoundError:  # as agentsaga's NatsLink::connect makes it
        await js.add_stream(name=STREAM, subjects=[f"{PREFIX}.>"], duplicate_window=120)

    tasks = [
        asyncio.create_task(consume(agent, js, args, stop)),
        asyncio.create_task(publish(agent, js, stop)),
    ]
    done, _ = await asyncio.wait(
        [*tasks, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await nc.close()  # what was fetched and not acknowledged comes back
    agent.db.close()
    failed = [t.exception() for t in done if t in tasks and t.exception()]
    if failed:
        log(f"stopped on an error: {failed[0]!r}")
        sys.exit(1)
    log("stopped")


if __name__ == "__main__":
    asyncio.run(main())
