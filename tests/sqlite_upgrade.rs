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

#[tokio::test]
async fn the_waiting_counts_start_from_the_queued_jobs_already_there() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    migrate_up_to(&url, 2).await;
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open");
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
