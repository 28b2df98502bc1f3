//! Schedules: the configured set is upserted at start; every node's
//! scheduler fires due slots under the schedule's row lock, so two nodes
//! never fire one slot (the unique (schedule_id, fire_at) index backs it).

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::rows::{self, log_event, notify};
use super::{JOBS_CHANNEL, PgStore};
use crate::job::{DEFAULT_MAX_ATTEMPTS, State};
use crate::store::{FireResult, FireSlot, Result, ScheduleDef, ScheduleInfo, StoreError};

macro_rules! schedule_cols {
    () => {
        "id, name, pipeline, target, args::text AS args, cron, timezone, overlap_queue, \
         enabled, max_attempts, paused, next_fire_at, last_fire_at, last_job_id, last_skip_at"
    };
}

fn schedule(r: &PgRow) -> Result<ScheduleInfo> {
    let name: String = r.try_get("name")?;
    let args: &str = r.try_get("args")?;
    let args = serde_json::from_str(args).map_err(|e| {
        StoreError::Database(format!("schedule {name}: args are not a JSON object: {e}"))
    })?;
    Ok(ScheduleInfo {
        id: r.try_get("id")?,
        def: ScheduleDef {
            name,
            pipeline: r.try_get("pipeline")?,
            target: r.try_get("target")?,
            args,
            cron: r.try_get("cron")?,
            timezone: r.try_get("timezone")?,
            overlap_queue: r.try_get("overlap_queue")?,
            enabled: r.try_get("enabled")?,
            max_attempts: r.try_get("max_attempts")?,
        },
        paused: r.try_get("paused")?,
        next_fire_at: r.try_get("next_fire_at")?,
        last_fire_at: r.try_get("last_fire_at")?,
        last_job_id: r.try_get("last_job_id")?,
        last_skip_at: r.try_get("last_skip_at")?,
    })
}

fn slot_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl PgStore {
    pub(super) async fn upsert_schedules(
        &self,
        defs: &[(ScheduleDef, Option<DateTime<Utc>>)],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (def, next) in defs {
            let args = serde_json::Value::Object(def.args.clone()).to_string();
            // The slot only moves when the timing rule changed; `paused`
            // belongs to operators and is never written here.
            sqlx::query(
                "INSERT INTO schedules AS s (name, pipeline, target, args, cron, timezone, \
                     overlap_queue, enabled, max_attempts, next_fire_at) \
                 VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (name) DO UPDATE SET pipeline = EXCLUDED.pipeline, \
                     target = EXCLUDED.target, args = EXCLUDED.args, cron = EXCLUDED.cron, \
                     timezone = EXCLUDED.timezone, overlap_queue = EXCLUDED.overlap_queue, \
                     enabled = EXCLUDED.enabled, max_attempts = EXCLUDED.max_attempts, \
                     next_fire_at = CASE \
                         WHEN s.cron <> EXCLUDED.cron OR s.timezone <> EXCLUDED.timezone \
                              OR s.next_fire_at IS NULL \
                         THEN EXCLUDED.next_fire_at ELSE s.next_fire_at END",
            )
            .bind(&def.name)
            .bind(&def.pipeline)
            .bind(&def.target)
            .bind(&args)
            .bind(&def.cron)
            .bind(&def.timezone)
            .bind(def.overlap_queue)
            .bind(def.enabled)
            .bind(def.max_attempts)
            .bind(next)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        let sql = concat!("SELECT ", schedule_cols!(), " FROM schedules ORDER BY name");
        let rows = sqlx::query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(schedule).collect()
    }

    pub(super) async fn fire(&self, id: i64, slot: FireSlot, actor: &str) -> Result<FireResult> {
        let mut tx = self.pool.begin().await?;
        let expected = match slot {
            FireSlot::Due { expected_next, .. } => Some(expected_next),
            FireSlot::Manual => None,
        };
        // Compared in SQL so the stored microsecond precision matches the
        // bound value's.
        let sql = concat!(
            "SELECT ",
            schedule_cols!(),
            ", next_fire_at IS NOT DISTINCT FROM $2 AS on_slot, now() AS db_now \
             FROM schedules WHERE id = $1 FOR UPDATE"
        );
        let row = sqlx::query(sql)
            .bind(id)
            .bind(expected)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::Invalid(format!("no schedule with id {id}")))?;
        let s = schedule(&row)?;
        let name = &s.def.name;
        // For a due slot, `Some(next)` = where next_fire_at moves.
        let moves_to = match slot {
            FireSlot::Due {
                expected_next,
                next,
            } => {
                if !row.try_get::<bool, _>("on_slot")? {
                    return Ok(FireResult::NotFired);
                }
                Some((expected_next, next))
            }
            FireSlot::Manual => None,
        };
        if moves_to.is_some() && (s.paused || !s.def.enabled) {
            self.move_slot(&mut tx, id, moves_to.and_then(|m| m.1))
                .await?;
            tx.commit().await?;
            return Ok(FireResult::NotFired);
        }
        let slot_label = match moves_to {
            Some((expected_next, _)) => slot_text(expected_next),
            None => slot_text(row.try_get("db_now")?),
        };
        if !s.def.overlap_queue {
            let blocking = sqlx::query(
                "SELECT id, state FROM jobs WHERE schedule_id = $1 \
                   AND state IN ('queued','leased','running','stale') ORDER BY id LIMIT 1",
            )
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(b) = blocking {
                let job_id: i64 = b.try_get("id")?;
                let state = rows::state(b.try_get("state")?)?;
                sqlx::query(
                    "UPDATE schedules SET last_skip_at = now(), \
                         next_fire_at = CASE WHEN $2 THEN $3 ELSE next_fire_at END \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(moves_to.is_some())
                .bind(moves_to.and_then(|m| m.1))
                .execute(&mut *tx)
                .await?;
                let detail =
                    format!("schedule {name} skipped slot {slot_label}: job #{job_id} unfinished");
                log_event(&mut tx, job_id, Some(state), state, actor, &detail).await?;
                tx.commit().await?;
                return Ok(FireResult::Skipped {
                    blocking_job: job_id,
                });
            }
        }
        let args = serde_json::Value::Object(s.def.args.clone()).to_string();
        let job_id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO jobs (pipeline, target, args, state, due_at, max_attempts, schedule_id, fire_at) \
             VALUES ($1, $2, $3::jsonb, 'queued', now(), $4, $5, COALESCE($6, now())) \
             ON CONFLICT (schedule_id, fire_at) WHERE schedule_id IS NOT NULL DO NOTHING \
             RETURNING id",
        )
        .bind(&s.def.pipeline)
        .bind(&s.def.target)
        .bind(&args)
        .bind(s.def.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS))
        .bind(id)
        .bind(moves_to.map(|m| m.0))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(job_id) = job_id else {
            // This slot already has its job: someone fired it first.
            return Ok(FireResult::NotFired);
        };
        log_event(
            &mut tx,
            job_id,
            None,
            State::Queued,
            actor,
            &format!("schedule {name}, slot {slot_label}"),
        )
        .await?;
        sqlx::query(
            "UPDATE schedules SET last_fire_at = now(), last_job_id = $2, \
                 next_fire_at = CASE WHEN $3 THEN $4 ELSE next_fire_at END \
             WHERE id = $1",
        )
        .bind(id)
        .bind(job_id)
        .bind(moves_to.is_some())
        .bind(moves_to.and_then(|m| m.1))
        .execute(&mut *tx)
        .await?;
        notify(&mut tx, JOBS_CHANNEL, &s.def.pipeline).await?;
        tx.commit().await?;
        Ok(FireResult::Fired { job_id })
    }

    async fn move_slot(
        &self,
        conn: &mut sqlx::PgConnection,
        id: i64,
        next: Option<DateTime<Utc>>,
    ) -> Result<()> {
        sqlx::query("UPDATE schedules SET next_fire_at = $2 WHERE id = $1")
            .bind(id)
            .bind(next)
            .execute(conn)
            .await?;
        Ok(())
    }

    pub(super) async fn pause_schedule(&self, name: &str, paused: bool) -> Result<()> {
        let done = sqlx::query("UPDATE schedules SET paused = $2 WHERE name = $1")
            .bind(name)
            .bind(paused)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Invalid(format!("no schedule named {name}")));
        }
        Ok(())
    }
}
