//! The writer moving between sqlx and the session.
#![forbid(unsafe_code)] // the parent's `unsafe` stays there

use super::*;

async fn writer() -> Writer {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    Writer::new(pool.acquire().await.unwrap())
}

fn count(s: &mut Session) -> i64 {
    let mut n = None;
    s.run(&Statement::plain("SELECT count(*) AS n FROM t"), |r| {
        n = Some(r.values[0].clone());
    })
    .unwrap();
    match n {
        Some(Value::Int(n)) => n,
        n => panic!("{n:?}"),
    }
}

// The writer moves between sqlx and the session, statements run on either, and a
// lock cancelled midway is finished when sqlx next needs the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_moves_between_sqlx_and_the_session() {
    let mut w = writer().await;
    sqlx::query("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .execute(w.conn())
        .await
        .unwrap();
    for round in 0..50i64 {
        let s = w.session().await.unwrap();
        let insert = Statement::with(
            "INSERT INTO t (k, v) VALUES (?, ?)",
            [Value::Int(round), Value::Text(format!("r{round}"))],
        );
        s.run(&insert, |_| {}).unwrap();
        assert_eq!(s.changes(), 1);
        let again = s.run(&insert, |_| {}).unwrap_err();
        let Error::Database(sqlx::Error::Database(db)) = &again else {
            panic!("{again:?}");
        };
        assert_eq!(db.code().as_deref(), Some("1555"), "{again:?}");
        assert_eq!(count(s), round + 1);
        // Half the time, a lock asked for and cancelled before it is granted.
        if round % 2 == 0 {
            w.unlock();
            let mut locking = std::pin::pin!(w.session());
            let _ = futures_poll_once(locking.as_mut()).await;
        }
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(w.conn())
            .await
            .unwrap();
        assert_eq!(n, round + 1);
    }
    let s = w.session().await.unwrap();
    let mut rows = Vec::new();
    s.run(
        &Statement::with(
            "SELECT k, v FROM t WHERE k >= ? ORDER BY k",
            [Value::Int(48)],
        ),
        |r| rows.push(r.values),
    )
    .unwrap();
    assert_eq!(
        rows,
        vec![
            vec![Value::Int(48), Value::Text("r48".into())],
            vec![Value::Int(49), Value::Text("r49".into())],
        ]
    );
    let wrong = s.run(&Statement::with("SELECT ?", []), |_| {});
    assert!(wrong.is_err(), "a value missing");
    drop(w);
}

/// Polls `f` once, then drops it.
async fn futures_poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut f = Some(f);
    std::future::poll_fn(|cx| Poll::Ready(f.take().map(|f| f.poll(cx))))
        .await
        .unwrap_or(Poll::Pending)
}
