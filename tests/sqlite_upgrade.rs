//! A SQLite database made by an earlier jobdeck is upgraded in place: the
//! migrations it lacks run when the store opens, and what they derive from
//! the existing rows is right.

use std::path::Path;

use sqlx::migrate::Migrator;

/// Apply the repository's SQLite migrations up to `last` (inclusive) only,
/// as an earlier binary would have.
async fn migrate_up_to(url: &str, last: i64) {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir("migrations/sqlite").expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let version: i64 = name[..4].parse().expect("numbered migration");
        if version <= last {
            std::fs::copy(&path, dir.path().join(&name)).expect("copy");
        }
    }
    let migrator = Migrator::new(Path::new(dir.path())).await.expect("read");
    let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("url");
    let pool = sqlx::SqlitePool::connect_with(opts.create_if_missing(true))
        .await
        .expect("open");
    migrator.run(&pool).await.expect("migrate");
    pool.close().await;
}

/// A database in a fresh temp dir as the binary of migration `last` left
/// it, with a pool open on it: the dir (dropped last), the URL, the pool.
async fn old_database(last: i64) -> (tempfile::TempDir, String, sqlx::SqlitePool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    migrate_up_to(&url, last).await;
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open");
    (dir, url, pool)
}

#[tokio::test]
async fn the_waiting_counts_start_from_the_queued_jobs_already_there() {
    let (_dir, url, pool) = old_database(2).await;
    // Job 1 holds t's lock; three queued jobs wait for t (one of them not
    // yet due), one for u (not locked), and finished jobs count for none.
    sqlx::raw_sql(
        "INSERT INTO jobs (pipeline, target, state, due_at, created_at, lease_token, lock_fence)
             VALUES ('p', 't', 'running', 0, 0, 7, 1);
         INSERT INTO jobs (pipeline, target, state, due_at, created_at) VALUES
             ('p', 't', 'queued', 0, 0), ('q', 't', 'queued', 0, 0),
             ('p', 't', 'queued', 99999999999999, 0), ('p', 'u', 'queued', 0, 0),
             ('p', 't', 'succeeded', 0, 0), ('p', 't', 'cancelled', 0, 0);
         INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at)
             VALUES ('t', 1, 1, 'w-1', 0);",
    )
    .execute(&pool)
    .await
    .expect("rows of the old schema");
    pool.close().await;

    let store = jobdeck::store::connect(&url).await.expect("upgrade");
    let locks = store.list_locks().await.expect("locks");
    let waiting: Vec<(String, i64)> = locks
        .iter()
        .map(|l| (l.target.clone(), l.waiting))
        .collect();
    assert_eq!(waiting, vec![("t".to_string(), 3)]);
    store
        .enqueue(
            jobdeck::store::NewJob {
                pipeline: "p".into(),
                target: Some("t".into()),
                ..Default::default()
            },
            "operator:test@host",
        )
        .await
        .expect("enqueue");
    assert_eq!(store.list_locks().await.expect("locks")[0].waiting, 4);
}

/// Every row of `jobs`, each column quoted, in id order.
async fn jobs_rows(pool: &sqlx::SqlitePool) -> Vec<String> {
    let (select,): (String,) = sqlx::query_as(
        "SELECT 'SELECT ' || group_concat('quote(' || name || ')', ' || ''|'' || ')
             || ' FROM jobs ORDER BY id'
         FROM pragma_table_info('jobs')",
    )
    .fetch_one(pool)
    .await
    .expect("column list");
    // Built from the table's own column names.
    sqlx::query_scalar(sqlx::AssertSqlSafe(select))
        .fetch_all(pool)
        .await
        .expect("rows")
}

/// What the rebuild must keep: the indexes and triggers on `jobs` (their
/// SQL), the state counts and the per-target queue counts.
async fn kept_around_jobs(pool: &sqlx::SqlitePool) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT name, sql FROM sqlite_master
         WHERE tbl_name = 'jobs' AND type IN ('index', 'trigger')
         UNION ALL SELECT 'count ' || state, CAST(n AS TEXT) FROM job_state_counts
         UNION ALL SELECT 'queued for ' || target, CAST(queued AS TEXT) FROM target_queue
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("schema and counts")
}

#[tokio::test]
async fn the_state_check_rebuild_keeps_rows_ids_indexes_and_triggers() {
    let (_dir, url, pool) = old_database(6).await;
    // Jobs in several states, with and without targets, a unique key and
    // a schedule slot; job 6, the newest, has been pruned.
    sqlx::raw_sql(
        "INSERT INTO jobs (pipeline, target, state, due_at, created_at, lease_token,
                           lock_fence, lease_owner, lease_expires_at, started_at, attempt)
             VALUES ('p', 't', 'running', 0, 0, 7, 1, 'w-1', 99, 5, 1);
         INSERT INTO jobs (pipeline, target, state, due_at, created_at, unique_key) VALUES
             ('p', 't', 'queued', 0, 0, 'k-1'), ('q', NULL, 'queued', 3, 0, NULL),
             ('p', 'u', 'stale', 0, 0, NULL);
         INSERT INTO jobs (pipeline, state, due_at, created_at, finished_at, last_error,
                           schedule_id, fire_at)
             VALUES ('p', 'failed', 0, 0, 10, 'boom', 1, 60), ('p', 'succeeded', 0, 0, 11, NULL, 1, 120);
         DELETE FROM jobs WHERE id = 6;
         INSERT INTO locks (target, fence, holder_job, holder_worker, acquired_at)
             VALUES ('t', 1, 1, 'w-1', 0);",
    )
    .execute(&pool)
    .await
    .expect("rows of the old schema");
    let rows_before = jobs_rows(&pool).await;
    let kept_before = kept_around_jobs(&pool).await;
    pool.close().await;

    // Up to the rebuild only: migration 0008 changes some indexes on
    // purpose (its own test is below).
    migrate_up_to(&url, 7).await;

    let pool = sqlx::SqlitePool::connect(&url).await.expect("reopen");
    assert_eq!(rows_before.len(), 5);
    assert_eq!(jobs_rows(&pool).await, rows_before);
    assert_eq!(kept_around_jobs(&pool).await, kept_before);
    let table: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'jobs'")
        .fetch_one(&pool)
        .await
        .expect("table");
    assert!(
        table.contains("state = 'cancelled'") && !table.contains("state IN"),
        "the check is not the rebuilt one: {table}"
    );
    // The pruned job's id is not given again, and the check still holds.
    let next = sqlx::query(
        "INSERT INTO jobs (pipeline, state, due_at, created_at) VALUES ('p', 'queued', 0, 0)",
    )
    .execute(&pool)
    .await
    .expect("insert")
    .last_insert_rowid();
    assert_eq!(next, 7);
    let bad = sqlx::query("UPDATE jobs SET state = 'done' WHERE id = 1")
        .execute(&pool)
        .await
        .expect_err("a state outside the seven");
    assert!(bad.to_string().contains("CHECK constraint failed"), "{bad}");
}

#[tokio::test]
async fn the_active_indexes_lose_their_in_lists_and_still_answer() {
    let (_dir, url, pool) = old_database(7).await;
    sqlx::raw_sql(
        "INSERT INTO jobs (pipeline, target, state, due_at, created_at, unique_key) VALUES
             ('p', 't', 'queued', 0, 0, 'k-1'), ('p', 'u', 'succeeded', 0, 0, 'k-2');",
    )
    .execute(&pool)
    .await
    .expect("rows of the old schema");
    let rows_before = jobs_rows(&pool).await;
    pool.close().await;

    let store = jobdeck::store::connect(&url).await.expect("upgrade");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("reopen");
    assert_eq!(jobs_rows(&pool).await, rows_before);
    let conditions: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master
         WHERE name IN ('jobs_target_active', 'jobs_unique_key', 'jobs_schedule_active')
         ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert_eq!(conditions.len(), 3);
    for (name, sql) in &conditions {
        assert!(
            !sql.contains(" IN ") && sql.contains("state = 'running'"),
            "{name} still has an IN list: {sql}"
        );
    }
    // The unique key of the unfinished job still dedupes; the finished
    // job's key is free.
    let keyed = |key: &str| jobdeck::store::NewJob {
        pipeline: "p".into(),
        unique_key: Some(key.into()),
        ..Default::default()
    };
    let again = store
        .enqueue(keyed("k-1"), "operator:test@host")
        .await
        .expect("enqueue");
    assert_eq!((again.id, again.deduplicated), (1, true));
    let fresh = store
        .enqueue(keyed("k-2"), "operator:test@host")
        .await
        .expect("enqueue");
    assert!(!fresh.deduplicated);
    // And the dedupe's look-up goes through the partial unique index.
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(concat!(
        "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE unique_key = 'k-1' AND ",
        "(state = 'queued' OR state = 'leased' OR state = 'running' OR state = 'stale')"
    ))
    .fetch_all(&pool)
    .await
    .expect("plan");
    assert!(
        plan.iter().any(|p| p.3.contains("jobs_unique_key")),
        "{plan:?}"
    );
}
