//! Postgres: a vacuum of `jobs` removes the entries that claimed jobs
//! leave in the claim index (migration 0014), also where Postgres's
//! default would skip the index scans, so the claim's scan does not step
//! over them. Runs in a database of its own: a vacuum removes only rows
//! that no transaction of the same database can still see, and the other
//! tests' transactions run in `JOBDECK_TEST_POSTGRES`'s database.
//! Runs only when JOBDECK_TEST_POSTGRES is set.

mod common;

use sqlx::{Connection, PgConnection};

use common::postgres_url;

/// Queued jobs in the table: enough pages that the jobs moved out of the
/// queue in one round sit on fewer than 2 % of them, under which
/// Postgres's default (`vacuum_index_cleanup = auto`) skips the index
/// scans.
const QUEUED: i64 = 200_000;
/// Jobs moved out of the queue per round: their entries fill about 8
/// leaf pages of the claim index, their rows about 1 % of the table's.
const MOVED: i64 = 2_000;

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let mut url = url::Url::parse(url).expect("JOBDECK_TEST_POSTGRES is a URL");
    url.set_path(db);
    url.into()
}

async fn run(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Buffers the claim's index scan reads to find its 8 jobs (the shape of
/// the engine's claim: the head of `jobs_claim`, locked, skipping locked).
async fn claim_scan_buffers(conn: &mut PgConnection) -> i64 {
    let plan: serde_json::Value = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) \
         SELECT id FROM jobs q WHERE q.state = 'queued' AND q.due_at <= now() \
         ORDER BY q.priority DESC, q.due_at, q.id LIMIT 8 FOR UPDATE SKIP LOCKED",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let mut node = &plan[0]["Plan"];
    while node["Node Type"] != "Index Scan" {
        node = &node["Plans"][0];
        assert!(!node.is_null(), "no index scan in {plan}");
    }
    assert_eq!(node["Index Name"], "jobs_claim", "{plan}");
    node["Shared Hit Blocks"].as_i64().unwrap() + node["Shared Read Blocks"].as_i64().unwrap()
}

/// Move the head of the queue out of `queued`, as claims do, then vacuum
/// as autovacuum would (a plain `VACUUM`, the table's own settings), and
/// measure the claim's scan.
async fn move_out_vacuum_and_scan(conn: &mut PgConnection) -> i64 {
    run(
        conn,
        &format!(
            "UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE id IN \
             (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT {MOVED})"
        ),
    )
    .await;
    run(conn, "VACUUM jobs").await;
    claim_scan_buffers(conn).await
}

#[tokio::test]
async fn vacuum_clears_the_claim_index_of_claimed_jobs() {
    let Some(base) = postgres_url("postgres vacuum test") else {
        return;
    };
    let db = format!("jobdeck_vacuum_{}", std::process::id());
    let mut admin = PgConnection::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("JOBDECK_TEST_POSTGRES is set but unreachable: {e}"));
    run(&mut admin, &format!("DROP DATABASE IF EXISTS {db}")).await;
    run(&mut admin, &format!("CREATE DATABASE {db}")).await;
    let url = with_database(&base, &db);
    let store = jobdeck::store::connect(&url).await.unwrap(); // migrates
    drop(store);
    let mut conn = PgConnection::connect(&url).await.unwrap();
    run(
        &mut conn,
        &format!(
            "INSERT INTO jobs (pipeline, state, due_at) \
             SELECT 'p', 'queued', now() FROM generate_series(1, {QUEUED})"
        ),
    )
    .await;
    run(&mut conn, "VACUUM ANALYZE jobs").await;
    let fresh = claim_scan_buffers(&mut conn).await;

    // With the migration's setting the vacuum takes the entries away.
    let cleaned = move_out_vacuum_and_scan(&mut conn).await;
    // With Postgres's default it leaves them, as few pages hold dead rows.
    run(&mut conn, "ALTER TABLE jobs RESET (vacuum_index_cleanup)").await;
    let left = move_out_vacuum_and_scan(&mut conn).await;

    assert!(
        cleaned <= fresh + 1,
        "after the vacuum the claim read {cleaned} buffers, {fresh} on a fresh queue"
    );
    assert!(
        left >= cleaned + 5,
        "the default's vacuum should have left the entries ({left} buffers against {cleaned}): \
         the test no longer shows what the setting changes"
    );
    conn.close().await.unwrap();
    run(&mut admin, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
}
