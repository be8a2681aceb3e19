#!/usr/bin/env python3
"""A `payments` agent in Python that serves an agentsaga saga over NATS JetStream.

It follows docs/remote.md ("The wire format, for a service in another language"), with
`nats-py` and the standard library's `sqlite3` only:
- the stream `AGENTSAGA` made as agentsaga makes it if it is missing (a work queue
  over `agentsaga.>`, duplicate window 2 minutes);
- a durable pull consumer on `agentsaga.payments`, explicit acks;
- per command, ONE transaction of its own SQLite file: the id into `inbox` (a repeat
  is skipped but acknowledged), the effect into `effects`, the reply (a fresh id,
  written once) into `outbox`; commit, then acknowledge;
- the first command of a batch that cannot be written stops the batch: it and every
  later one are handed back (-NAK, confirmed) at once, so that the server delivers them
  again before anything after them, in order (an undo never lands before its do);
- the command's `timeout_ms`, counted from when it is taken: past it the work is
  dropped and a `timeout` answer goes to its `reply_to`;
- a publisher of the outbox in order to `agentsaga.<reply_to>`, `Nats-Msg-Id` = the
  reply's id, the headers percent-encoded where NATS needs it, a row marked published
  only on the stream's acknowledgement;
- input it cannot serve: logged with the reason, kept in `dead`, answered to its
  `reply_to` (if it has one) with `delivery_failed`, terminated.

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
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig
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


def is_destination(d):
    """Whether `d` is a destination a subject can carry: NATS tokens separated by dots,
    none empty, without spaces, control characters, `*` or `>`."""
    return all(
        t and not any(c in "*>" or c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in t)
        for t in d.split(".")
    )


def percent_encoded(s, name):
    """`s` as it goes in a NATS header (docs/remote.md): every byte that is not printable
    ASCII, and `%` (in a name also `:`), as `%XX`; a name starting `Nats-` has its first
    letter so written (the server's instructions are never a saga's header)."""
    out = []
    server_word = name and s[:5].lower() == "nats-"
    for i, b in enumerate(s.encode()):
        plain = 0x21 <= b <= 0x7E and b != 0x25 and not (name and b == 0x3A)
        out.append(chr(b) if plain and not (server_word and i == 0) else f"%{b:02X}")
    return "".join(out)


def nats_headers(headers, message_id):
    """The NATS headers of a message: its own, percent-encoded, and `Nats-Msg-Id`."""
    out = {percent_encoded(k, True): percent_encoded(v, False) for k, v in headers.items() if k}
    out["Nats-Msg-Id"] = message_id
    return out


def answer(env, kind):
    """The headers of an answer of `kind` to the command `env`."""
    headers = env["headers"]
    return {"kind": kind, "causation_id": env["id"],
            **{h: headers[h] for h in ("saga_id", "step", "step_name")
               if isinstance(headers.get(h), str)}}


def deadline_of(env):
    """When the work on `env` must be done by (its `timeout_ms` from now), or None."""
    try:
        ms = int(env["headers"].get("timeout_ms", ""))
    except ValueError:
        return None
    return time.monotonic() + ms / 1000 if ms > 0 else None


def parse(body):
    """The command envelope in `body`, checked, or Malformed with the reason."""
    try:
        env = json.loads(body)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
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
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise Malformed("the envelope's headers are not all strings")
    try:  # a lone surrogate would fail the database, and the publisher, forever
        for k, v in headers.items():
            k.encode()
            v.encode()
    except UnicodeEncodeError:
        raise Malformed("a header is not valid Unicode") from None
    t = headers.get("timeout_ms")
    if t is not None and not (t.isascii() and t.isdigit() and len(t) <= 19):
        raise Malformed(f"timeout_ms {t[:40]!r} is not a number of milliseconds")
    if headers.get("kind") not in ("command", "compensate"):
        raise Malformed(f"kind {headers.get('kind')!r} is neither command nor compensate")
    for name in ("reply_to", "saga_id", "step", "step_name"):
        if not isinstance(headers.get(name), str) or not headers[name]:
            raise Malformed(f"the {headers['kind']} has no {name} header")
    if not is_destination(headers["reply_to"]):
        raise Malformed(f"reply_to {headers['reply_to']!r} is not a destination")
    try:
        json.loads(env.get("payload"))
    except (TypeError, ValueError, RecursionError):
        raise Malformed("the envelope's payload is not JSON text") from None
    return env


class Payments:
    """The agent: its database, and what it does with one command."""

    def __init__(self, path, charge_ms=0, fail_writes=0):
        # Autocommit mode: every transaction is an explicit BEGIN … COMMIT below.
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.wake = asyncio.Event()  # set when the outbox has something new
        self.charge_ms = charge_ms  # how long the payment provider takes (tests)
        self.fail_writes = fail_writes  # commands whose write fails first (tests)

    def seen(self, message_id):
        return self.db.execute(
            "SELECT 1 FROM inbox WHERE message_id = ?", (message_id,)
        ).fetchone() is not None

    async def charge(self, env):
        """The outside call (a payment provider, with the command's idempotency_key);
        here only its time."""
        await asyncio.sleep(self.charge_ms / 1000)

    def reply(self, db, env, kind, payload):
        """Writes an answer of `kind` to the command's `reply_to` into the outbox."""
        db.execute(
            "INSERT INTO outbox (id, destination, headers, payload, created_at_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            (str(uuid.uuid4()), env["headers"]["reply_to"], json.dumps(answer(env, kind)),
             payload, int(time.time() * 1000)),
        )

    @contextlib.contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    async def handle(self, env):
        """The work, bounded by the command's `timeout_ms`, then inbox, effect and reply
        in one transaction (past the timeout: inbox and a `timeout` answer, no effect).
        Returns "done", "timeout" or "repeat"; raises sqlite3.Error if nothing could be
        written."""
        headers = env["headers"]
        if self.seen(env["id"]):
            return "repeat"
        deadline = deadline_of(env)
        timed_out = False
        try:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            await asyncio.wait_for(self.charge(env), remaining)
        except asyncio.TimeoutError:  # dropped: the orchestrator's timeout rules apply
            timed_out = True
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise sqlite3.OperationalError("database is locked (--fail-writes)")
        with self.transaction() as db:
            seen = db.execute(
                "INSERT INTO inbox (message_id) VALUES (?) ON CONFLICT DO NOTHING", (env["id"],)
            ).rowcount == 0
            if seen:
                return "repeat"
            if timed_out:
                self.reply(db, env, "timeout", "null")
            else:
                effect = "payments/undo" if headers["kind"] == "compensate" else "payments/do"
                db.execute(
                    "INSERT INTO effects (saga, effect) VALUES (?, ?)",
                    (headers["saga_id"], effect),
                )
                self.reply(db, env, "reply", json.dumps({"ok": {"by": "payments"}}))
        self.wake.set()
        return "timeout" if timed_out else "done"

    def dead(self, stream_seq, reason, body):
        """Keeps input it cannot serve, with the reason (a redelivery is kept once), and
        tells its `reply_to`, if it names one, with `delivery_failed`."""
        log(f"dead letter (stream seq {stream_seq}): {reason}")
        try:
            env = json.loads(body)
            to = env["headers"]["reply_to"]
            uuid.UUID(env["id"])
            if not isinstance(to, str) or not to or not is_destination(to):
                env = None
        except Exception:  # no envelope, no reply_to: nobody to tell
            env = None
        with self.transaction() as db:
            fresh = db.execute(
                "INSERT INTO dead (stream_seq, reason, body) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (stream_seq, reason, body.decode("utf-8", "replace")),
            ).rowcount == 1
            if fresh and env is not None:
                failed = {"message_id": env["id"], "destination": DESTINATION, "reason": reason}
                self.reply(db, env, "delivery_failed", json.dumps(failed))
        self.wake.set()

    def unpublished(self):
        return self.db.execute(
            "SELECT seq, id, destination, headers, payload, created_at_ms FROM outbox"
            " WHERE published = 0 ORDER BY seq LIMIT 100"
        ).fetchall()

    def published(self, seq):
        self.db.execute("UPDATE outbox SET published = 1 WHERE seq = ?", (seq,))


async def handed_back(nc, messages):
    """Hands `messages` back to the server (-NAK, no delay), each confirmed, in order:
    it delivers them again before anything after them. False if one was not confirmed
    (it then comes back only after the ack wait)."""
    for msg in messages:
        try:
            await nc.request(msg.reply, b"-NAK", timeout=5)
        except Exception as e:
            log(f"hand-back not confirmed: {e!r}")
            return False
    return True


async def consume(agent, nc, js, args, stop):
    """Takes commands from the durable consumer, one transaction each, until `stop`."""
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=args.ack_wait, max_deliver=-1
    )
    sub = await js.pull_subscribe(
        f"{PREFIX}.{DESTINATION}", durable=args.durable, stream=STREAM, config=config
    )
    print("ready", flush=True)
    handled = 0
    pause = 0.0  # after a batch that could not be written: grows, up to 5 s
    while not stop.is_set():
        if pause:
            await asyncio.sleep(pause)
        try:
            batch = await sub.fetch(batch=10, timeout=1)
        except (NatsTimeout, asyncio.TimeoutError):  # nothing new within a second
            continue
        except Exception as e:  # the server away: the client reconnects
            log(f"fetch failed, will retry: {e!r}")
            await asyncio.sleep(0.5)
            continue
        failed = None  # the first message that could not be written
        for i, msg in enumerate(batch):
            try:
                try:
                    env = parse(msg.data)
                except Malformed as why:
                    agent.dead(msg.metadata.sequence.stream, str(why), msg.data)
                    await msg.term()
                    continue
                outcome = await agent.handle(env)
            except Malformed as why:  # found while handling: kept, not retried forever
                agent.dead(msg.metadata.sequence.stream, str(why), msg.data)
                await msg.term()
                continue
            except sqlite3.Error as e:  # nothing was written
                log(f"message {i + 1} of the batch not stored: {e!r}; it and the "
                    f"{len(batch) - i - 1} after it handed back")
                failed = i
                break
            if outcome == "repeat":
                log(f"message {env['id']} is a repeat: acknowledged, not applied again")
            elif outcome == "timeout":
                log(f"message {env['id']} ran past its timeout_ms: answered timeout")
            handled += 1
            if handled == args.crash_before_ack:
                # For tests: die like `kill -9` between the commit and the ack.
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                await msg.ack_sync()
            except Exception as e:  # it comes back, and the inbox knows it
                log(f"acknowledgement of {env['id']} not confirmed: {e!r}")
        if failed is None:
            pause = 0.0
            continue
        # Never go on past a message not written: later ones of its key (its undo)
        # would land first. Hand it and the rest back, then fetch again after a pause.
        if not await handed_back(nc, batch[failed:]):
            await asyncio.sleep(args.ack_wait)  # wait for what was not handed back
        pause = min(max(pause * 2, 0.1), 5.0)


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
            # The headers go as they are in the envelope, percent-encoded in NATS's.
            envelope = {"seq": seq, "id": id_, "destination": destination, "key": None,
                        "payload": payload, "headers": header_map, "attempts": 1,
                        "created_at_ms": created}
            try:
                await js.publish(
                    f"{PREFIX}.{destination}",
                    json.dumps(envelope).encode(),
                    stream=STREAM,
                    headers=nats_headers(header_map, id_),
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
    parser.add_argument("--charge-ms", type=int, default=0, metavar="MS",
                        help="how long a charge's outside call takes (a stand-in for a provider)")
    parser.add_argument("--fail-writes", type=int, default=0, metavar="N",
                        help="for tests: the first N commands' writes fail (database locked)")
    args = parser.parse_args()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    agent = Payments(args.db, charge_ms=args.charge_ms, fail_writes=args.fail_writes)
    nc = await nats.connect(args.nats, max_reconnect_attempts=-1, **secured())
    js = nc.jetstream()
    try:
        await js.stream_info(STREAM)
    except NotFoundError:  # exactly as agentsaga's NatsLink::connect makes it
        await js.add_stream(StreamConfig(
            name=STREAM, subjects=[f"{PREFIX}.>"], duplicate_window=120,
            retention=RetentionPolicy.WORK_QUEUE,
        ))

    tasks = [
        asyncio.create_task(consume(agent, nc, js, args, stop)),
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
