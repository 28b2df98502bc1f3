//! Schedules: upsert from the config, list, fire a slot exactly once, pause.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::SqliteStore;
use super::rows::{self, event, now_ms, unfinished_cond};
use crate::job::{self, State};
use crate::store::{FireResult, FireSlot, Result, ScheduleDef, ScheduleInfo, StoreError};

fn schedule_from_row(r: &SqliteRow) -> Result<ScheduleInfo> {
    Ok(ScheduleInfo {
        id: r.try_get("id")?,
        def: ScheduleDef {
            name: r.try_get("name")?,
            pipeline: r.try_get("pipeline")?,
            target: r.try_get("target")?,
            args: rows::json_map(r.try_get("args")?)?,
            cron: r.try_get("cron")?,
            timezone: r.try_get("timezone")?,
            overlap_queue: r.try_get("overlap_queue")?,
            enabled: r.try_get("enabled")?,
            max_attempts: r.try_get("max_attempts")?,
        },
        paused: r.try_get("paused")?,
        next_fire_at: rows::opt_time(r.try_get("next_fire_at")?)?,
        last_fire_at: rows::opt_time(r.try_get("last_fire_at")?)?,
        last_job_id: r.try_get("last_job_id")?,
        last_skip_at: rows::opt_time(r.try_get("last_skip_at")?)?,
    })
}

const SCHEDULE_COLS: &str = "id, name, pipeline, target, args, cron, timezone, overlap_queue, \
     enabled, max_attempts, paused, next_fire_at, last_fire_at, last_job_id, last_skip_at";

fn slot_text(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl SqliteStore {
    pub(super) async fn do_sync_schedules(
        &self,
        defs: &[(ScheduleDef, Option<DateTime<Utc>>)],
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        for (def, next) in defs {
            let args = serde_json::to_string(&def.args).map_err(|e| {
                StoreError::Invalid(format!("schedule {}: bad args: {e}", def.name))
            })?;
            // The slot only moves when the timing rule changed: a restart must
            // not skip or repeat the pending fire. `paused` is the operator's.
            sqlx::query(
                "INSERT INTO schedules (name, pipeline, target, args, cron, timezone,
                     overlap_queue, enabled, max_attempts, next_fire_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (name) DO UPDATE SET pipeline = excluded.pipeline,
                     target = excluded.target, args = excluded.args,
                     overlap_queue = excluded.overlap_queue, enabled = excluded.enabled,
                     max_attempts = excluded.max_attempts,
                     next_fire_at = CASE
                         WHEN schedules.cron IS NOT excluded.cron
                           OR schedules.timezone IS NOT excluded.timezone
                           OR schedules.next_fire_at IS NULL
                         THEN excluded.next_fire_at ELSE schedules.next_fire_at END,
                     cron = excluded.cron, timezone = excluded.timezone",
            )
            .bind(&def.name)
            .bind(&def.pipeline)
            .bind(&def.target)
            .bind(args)
            .bind(&def.cron)
            .bind(&def.timezone)
            .bind(def.overlap_queue)
            .bind(def.enabled)
            .bind(def.max_attempts)
            .bind(next.map(|t| t.timestamp_millis()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn do_list_schedules(&self) -> Result<Vec<ScheduleInfo>> {
        let sql = format!("SELECT {SCHEDULE_COLS} FROM schedules ORDER BY name");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(schedule_from_row).collect()
    }

    pub(super) async fn do_fire_schedule(
        &self,
        id: i64,
        slot: FireSlot,
        actor: &str,
    ) -> Result<FireResult> {
        let mut tx = self.begin().await?;
        let now = now_ms();
        let sql = format!("SELECT {SCHEDULE_COLS} FROM schedules WHERE id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::Invalid(format!("no schedule with id {id}")))?;
        let sched = schedule_from_row(&row)?;
        let name = &sched.def.name;
        let (fire_at, next) = match slot {
            FireSlot::Due {
                expected_next,
                next,
            } => {
                // Another node fired this slot, or a sync moved it.
                if sched.next_fire_at.map(|t| t.timestamp_millis())
                    != Some(expected_next.timestamp_millis())
                {
                    return Ok(FireResult::NotFired);
                }
                let next = next.map(|t| t.timestamp_millis());
                if sched.paused || !sched.def.enabled {
                    sqlx::query("UPDATE schedules SET next_fire_at = ? WHERE id = ?")
                        .bind(next)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    return Ok(FireResult::NotFired);
                }
                (expected_next.timestamp_millis(), Some(next))
            }
            FireSlot::Manual => (now, None),
        };
        let slot_shown = slot_text(rows::to_time(fire_at)?);
        if !sched.def.overlap_queue {
            let blocking = sqlx::query(concat!(
                "SELECT id, state FROM jobs WHERE schedule_id = ? AND ",
                unfinished_cond!(),
                " ORDER BY id LIMIT 1"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(b) = blocking {
                let job_id: i64 = b.try_get("id")?;
                let st: State = rows::state(b.try_get("state")?)?;
                sqlx::query(
                    "UPDATE schedules SET last_skip_at = ?1,
                         next_fire_at = CASE WHEN ?2 THEN ?3 ELSE next_fire_at END
                     WHERE id = ?4",
                )
                .bind(now)
                .bind(next.is_some())
                .bind(next.flatten())
                .bind(id)
                .execute(&mut *tx)
                .await?;
                let detail =
                    format!("schedule {name} skipped slot {slot_shown}: job #{job_id} unfinished");
                event(&mut tx, job_id, now, Some(st), st, actor, &detail).await?;
                tx.commit().await?;
                return Ok(FireResult::Skipped {
                    blocking_job: job_id,
                });
            }
        }
        let args = serde_json::to_string(&sched.def.args)
            .map_err(|e| StoreError::Database(format!("schedule {name}: bad args: {e}")))?;
        // The slot index makes a second fire of the same slot impossible even
        // if two transactions got this far.
        let job_id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO jobs (pipeline, target, args, state, due_at, max_attempts, schedule_id,
                 fire_at, created_at)
             VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?6, ?7, ?4)
             ON CONFLICT (schedule_id, fire_at) WHERE schedule_id IS NOT NULL DO NOTHING
             RETURNING id",
        )
        .bind(&sched.def.pipeline)
        .bind(&sched.def.target)
        .bind(args)
        .bind(now)
        .bind(sched.def.max_attempts.unwrap_or(job::DEFAULT_MAX_ATTEMPTS))
        .bind(id)
        .bind(fire_at)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(job_id) = job_id else {
            return Ok(FireResult::NotFired);
        };
        sqlx::query(
            "UPDATE schedules SET last_fire_at = ?1, last_job_id = ?2,
                 next_fire_at = CASE WHEN ?3 THEN ?4 ELSE next_fire_at END
             WHERE id = ?5",
        )
        .bind(now)
        .bind(job_id)
        .bind(next.is_some())
        .bind(next.flatten())
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let detail = format!("schedule {name}, slot {slot_shown}");
        event(&mut tx, job_id, now, None, State::Queued, actor, &detail).await?;
        tx.commit().await?;
        Ok(FireResult::Fired { job_id })
    }

    pub(super) async fn do_set_schedule_paused(&self, name: &str, paused: bool) -> Result<()> {
        let mut tx = self.begin().await?;
        let done = sqlx::query("UPDATE schedules SET paused = ? WHERE name = ?")
            .bind(paused)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Invalid(format!("no schedule named {name}")));
        }
        tx.commit().await?;
        Ok(())
    }
}
