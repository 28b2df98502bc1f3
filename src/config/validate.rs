//! From the file as written to a [`Config`] that the engine can trust:
//! defaults filled in, every value range-checked, every cross-reference
//! (schedule → pipeline → placeholders) resolved.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use toml::Spanned;

use super::locate::{Located, line_of};
use super::raw::{Dur, RawConfig, RawPipeline, RawSchedule, RawStep, RawWorkers};
use super::{
    Builtin, Config, DEFAULT_BUSY_POLL, DEFAULT_CYCLES_IN_FLIGHT, DEFAULT_DRAIN_GRACE,
    DEFAULT_KILL_GRACE, DEFAULT_LEASE, DEFAULT_LOCK_WAIT, DEFAULT_POLL, DEFAULT_RETENTION,
    DEFAULT_SLOTS, DEFAULT_TIMEZONE, DatabaseConfig, Pipeline, Schedule, Step, StepAction,
    WorkersConfig, schedule, template,
};
use crate::job::{DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS};

type Result<T> = std::result::Result<T, Located>;

/// Below this, renewals (lease/3) and the supervisor margin (lease/4) are
/// too short to survive an ordinary database hiccup.
const MIN_LEASE: Duration = Duration::from_secs(1);

pub(super) fn build(raw: RawConfig, text: &str) -> Result<Config> {
    let workers = workers(raw.workers)?;

    let mut pipelines = Vec::with_capacity(raw.pipeline.len());
    let mut seen = HashMap::new();
    for p in raw.pipeline {
        unique(&mut seen, &p.get_ref().name, "pipeline", text)?;
        pipelines.push(pipeline(p)?);
    }

    let mut schedules = Vec::with_capacity(raw.schedule.len());
    let mut seen = HashMap::new();
    for s in raw.schedule {
        unique(&mut seen, &s.get_ref().name, "schedule", text)?;
        schedules.push(schedule(s, &pipelines)?);
    }

    Ok(Config {
        database: DatabaseConfig {
            url: raw.database.url,
        },
        workers,
        pipelines,
        schedules,
        source: None,
    })
}

/// Names are how operators, the CLI and the database refer to pipelines and
/// schedules: two with one name would make one of them unreachable.
fn unique(
    seen: &mut HashMap<String, usize>,
    name: &Spanned<String>,
    kind: &str,
    text: &str,
) -> Result<()> {
    let n = name.get_ref();
    if n.trim().is_empty() {
        return Err(Located::at(
            name.span().start,
            format!("{kind}: name: must not be empty"),
        ));
    }
    if let Some(first) = seen.insert(n.clone(), name.span().start) {
        return Err(Located::at(
            name.span().start,
            format!(
                "{kind} {n:?}: name: duplicate {kind} name (first defined on line {})",
                line_of(text, first)
            ),
        ));
    }
    Ok(())
}

fn workers(w: RawWorkers) -> Result<WorkersConfig> {
    let slots = w
        .slots
        .map_or(Ok(DEFAULT_SLOTS), |s| at_least_one(s, "workers: slots"))?;
    let cycles_in_flight = w
        .cycles_in_flight
        .map_or(Ok(DEFAULT_CYCLES_IN_FLIGHT), |c| {
            at_least_one(c, "workers: cycles_in_flight")
        })?;
    let lease = w.lease.map_or(Ok(DEFAULT_LEASE), |l| {
        let d = l.get_ref().0;
        if d < MIN_LEASE {
            Err(Located::at(
                l.span().start,
                format!("workers: lease: must be at least 1s (got {d:?})"),
            ))
        } else {
            Ok(d)
        }
    })?;
    let poll = w
        .poll
        .map_or(Ok(DEFAULT_POLL), |p| positive(p, "workers: poll"))?;
    Ok(WorkersConfig {
        slots,
        cycles_in_flight,
        busy_poll: w.busy_poll.map_or(DEFAULT_BUSY_POLL, |d| d.0),
        lease,
        poll,
        kill_grace: w.kill_grace.map_or(DEFAULT_KILL_GRACE, |d| d.0),
        drain_grace: w.drain_grace.map_or(DEFAULT_DRAIN_GRACE, |d| d.0),
        retention: w.retention.map_or(DEFAULT_RETENTION, |d| d.0),
    })
}

fn at_least_one(n: Spanned<i64>, what: &str) -> Result<usize> {
    match usize::try_from(*n.get_ref()) {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(Located::at(
            n.span().start,
            format!("{what}: must be at least 1 (got {})", n.get_ref()),
        )),
    }
}

/// A zero poll interval spins; a zero timeout kills every run at once.
fn positive(d: Spanned<Dur>, what: &str) -> Result<Duration> {
    let v = d.get_ref().0;
    if v.is_zero() {
        return Err(Located::at(
            d.span().start,
            format!("{what}: must be longer than 0s"),
        ));
    }
    Ok(v)
}

fn pipeline(sp: Spanned<RawPipeline>) -> Result<Pipeline> {
    let header = sp.span().start;
    let p = sp.into_inner();
    let name = p.name.into_inner();
    let ctx = format!("pipeline {name:?}");

    let max_attempts = match p.max_attempts {
        None => DEFAULT_MAX_ATTEMPTS,
        Some(m) => match i32::try_from(*m.get_ref()) {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(Located::at(
                    m.span().start,
                    format!(
                        "{ctx}: max_attempts: must be at least 1 (got {})",
                        m.get_ref()
                    ),
                ));
            }
        },
    };
    let timeout = p
        .timeout
        .map(|t| positive(t, &format!("{ctx}: timeout")))
        .transpose()?;

    if p.step.is_empty() {
        return Err(Located::at(
            header,
            format!("{ctx}: has no steps (add at least one [[pipeline.step]])"),
        ));
    }
    let mut steps: Vec<Step> = Vec::with_capacity(p.step.len());
    for s in p.step {
        let name = &s.get_ref().name;
        if let Some(first) = steps.iter().find(|st| &st.name == name.get_ref()) {
            return Err(Located::at(
                name.span().start,
                format!("{ctx}: step {:?}: name: duplicate step name", first.name),
            ));
        }
        steps.push(step(s, &ctx)?);
    }

    Ok(Pipeline {
        name,
        max_attempts,
        backoff: p.backoff.map_or(DEFAULT_BACKOFF, |d| d.0),
        timeout,
        on_lock_busy: p.on_lock_busy.unwrap_or_default(),
        lock_wait: p.lock_wait.map_or(DEFAULT_LOCK_WAIT, |d| d.0),
        on_stale: p.on_stale.unwrap_or_default(),
        steps,
    })
}

fn step(sp: Spanned<RawStep>, pipeline_ctx: &str) -> Result<Step> {
    let header = sp.span().start;
    let s = sp.into_inner();
    let name = s.name.get_ref().clone();
    if name.trim().is_empty() {
        return Err(Located::at(
            s.name.span().start,
            format!("{pipeline_ctx}: step: name: must not be empty"),
        ));
    }
    let ctx = format!("{pipeline_ctx}: step {name:?}");
    let timeout = s
        .timeout
        .map(|t| positive(t, &format!("{ctx}: timeout")))
        .transpose()?;

    let action = match (s.run, s.builtin) {
        (Some(_), Some(b)) => {
            return Err(Located::at(
                b.span().start,
                format!("{ctx}: builtin: a step has either `run` or `builtin`, not both"),
            ));
        }
        (None, None) => {
            return Err(Located::at(
                header,
                format!("{ctx}: needs `run` (a command) or `builtin`"),
            ));
        }
        (Some(run), None) => {
            let unused = [
                ("duration", s.duration.map(|d| d.span())),
                ("fail_probability", s.fail_probability.map(|d| d.span())),
                ("probability", s.probability.map(|d| d.span())),
            ];
            if let Some((key, Some(span))) = unused.into_iter().find(|(_, sp)| sp.is_some()) {
                return Err(Located::at(
                    span.start,
                    format!("{ctx}: {key}: only applies to a builtin step"),
                ));
            }
            command(run, s.cwd, s.env, &ctx)?
        }
        (None, Some(b)) => {
            let unused = [
                ("cwd", s.cwd.map(|d| d.span())),
                ("env", s.env.map(|d| d.span())),
            ];
            if let Some((key, Some(span))) = unused.into_iter().find(|(_, sp)| sp.is_some()) {
                return Err(Located::at(
                    span.start,
                    format!("{ctx}: {key}: only applies to a `run` command"),
                ));
            }
            StepAction::Builtin(builtin(
                b,
                s.duration,
                s.fail_probability,
                s.probability,
                &ctx,
            )?)
        }
    };
    Ok(Step {
        name,
        action,
        timeout,
    })
}

fn command(
    run: Spanned<Vec<Spanned<String>>>,
    cwd: Option<Spanned<std::path::PathBuf>>,
    env: Option<Spanned<BTreeMap<String, String>>>,
    ctx: &str,
) -> Result<StepAction> {
    let run_at = run.span().start;
    let items = run.into_inner();
    match items.first() {
        None => {
            return Err(Located::at(
                run_at,
                format!("{ctx}: run: is empty (the first item is the program to run)"),
            ));
        }
        Some(program) if program.get_ref().trim().is_empty() => {
            return Err(Located::at(
                program.span().start,
                format!("{ctx}: run: the program (first item) is empty"),
            ));
        }
        Some(_) => {}
    }
    for item in &items {
        template::check(std::slice::from_ref(item.get_ref()))
            .map_err(|e| Located::at(item.span().start, format!("{ctx}: run: {e}")))?;
    }
    Ok(StepAction::Command {
        run: items.into_iter().map(Spanned::into_inner).collect(),
        cwd: cwd.map(Spanned::into_inner),
        env: env.map(Spanned::into_inner).unwrap_or_default(),
    })
}

fn builtin(
    b: Spanned<String>,
    duration: Option<Spanned<Dur>>,
    fail_probability: Option<Spanned<f64>>,
    probability: Option<Spanned<f64>>,
    ctx: &str,
) -> Result<Builtin> {
    let kind = b.get_ref().as_str();
    // Keys that this builtin ignores are refused: a `duration` on a `noop`
    // is a mistake the author wants to hear about.
    let refuse = |key: &str, span: Option<std::ops::Range<usize>>| match span {
        Some(span) => Err(Located::at(
            span.start,
            format!("{ctx}: {key}: does not apply to builtin = {kind:?}"),
        )),
        None => Ok(()),
    };
    let prob = |key: &str, p: Spanned<f64>| {
        let v = *p.get_ref();
        if (0.0..=1.0).contains(&v) {
            Ok(v)
        } else {
            Err(Located::at(
                p.span().start,
                format!("{ctx}: {key}: must be between 0 and 1 (got {v})"),
            ))
        }
    };
    let fp_span = fail_probability.as_ref().map(|p| p.span());
    let p_span = probability.as_ref().map(|p| p.span());
    let d_span = duration.as_ref().map(|d| d.span());
    match kind {
        "noop" | "hang" => {
            refuse("duration", d_span)?;
            refuse("fail_probability", fp_span)?;
            refuse("probability", p_span)?;
            Ok(if kind == "noop" {
                Builtin::Noop
            } else {
                Builtin::Hang
            })
        }
        "sleep" => {
            refuse("probability", p_span)?;
            let Some(duration) = duration else {
                return Err(Located::at(
                    b.span().start,
                    format!("{ctx}: builtin = \"sleep\" needs `duration` (e.g. duration = \"2s\")"),
                ));
            };
            Ok(Builtin::Sleep {
                duration: duration.into_inner().0,
                fail_probability: fail_probability
                    .map(|p| prob("fail_probability", p))
                    .transpose()?
                    .unwrap_or(0.0),
            })
        }
        "fail" => {
            refuse("duration", d_span)?;
            refuse("fail_probability", fp_span)?;
            Ok(Builtin::Fail {
                probability: probability
                    .map(|p| prob("probability", p))
                    .transpose()?
                    .unwrap_or(1.0),
            })
        }
        other => Err(Located::at(
            b.span().start,
            format!(
                "{ctx}: builtin: unknown builtin {other:?} (expected noop, sleep, fail or hang)"
            ),
        )),
    }
}

fn schedule(sp: Spanned<RawSchedule>, pipelines: &[Pipeline]) -> Result<Schedule> {
    let s = sp.into_inner();
    let name = s.name.get_ref().clone();
    let ctx = format!("schedule {name:?}");

    let wanted = s.pipeline.get_ref();
    let Some(pipeline) = pipelines.iter().find(|p| &p.name == wanted) else {
        let known: Vec<&str> = pipelines.iter().map(|p| p.name.as_str()).collect();
        let known = if known.is_empty() {
            "none is defined".to_string()
        } else {
            format!("defined: {}", known.join(", "))
        };
        return Err(Located::at(
            s.pipeline.span().start,
            format!("{ctx}: pipeline: unknown pipeline {wanted:?} ({known})"),
        ));
    };

    if let Some(t) = &s.target
        && t.get_ref().trim().is_empty()
    {
        return Err(Located::at(
            t.span().start,
            format!("{ctx}: target: must not be empty (leave it out for no target)"),
        ));
    }
    let args: serde_json::Map<String, serde_json::Value> = s
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, to_json(v)))
        .collect();

    // Every fired job would fail at the same step: refuse now instead.
    if s.target.is_none() && pipeline.needs_target() {
        return Err(Located::at(
            s.name.span().start,
            format!(
                "{ctx}: target: missing (pipeline {:?} uses {{target}})",
                pipeline.name
            ),
        ));
    }
    if let Some(missing) = pipeline
        .arg_names()
        .into_iter()
        .find(|a| !args.contains_key(a))
    {
        return Err(Located::at(
            s.name.span().start,
            format!(
                "{ctx}: args: missing `{missing}` (pipeline {:?} uses {{arg.{missing}}})",
                pipeline.name
            ),
        ));
    }

    schedule::parse_cron(s.cron.get_ref())
        .map_err(|e| Located::at(s.cron.span().start, format!("{ctx}: cron: {e}")))?;
    let timezone = match s.timezone {
        None => DEFAULT_TIMEZONE.to_string(),
        Some(tz) => {
            schedule::parse_timezone(tz.get_ref())
                .map_err(|e| Located::at(tz.span().start, format!("{ctx}: timezone: {e}")))?;
            tz.into_inner()
        }
    };

    Ok(Schedule {
        name,
        pipeline: pipeline.name.clone(),
        target: s.target.map(Spanned::into_inner),
        args,
        cron: s.cron.into_inner(),
        timezone,
        overlap: s.overlap.unwrap_or_default(),
        enabled: s.enabled.unwrap_or(true),
    })
}

/// Job args are JSON in the database; TOML dates become their text.
fn to_json(v: toml::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        toml::Value::String(s) => J::String(s),
        toml::Value::Integer(i) => J::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(J::Null, J::Number),
        toml::Value::Boolean(b) => J::Bool(b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(a) => J::Array(a.into_iter().map(to_json).collect()),
        toml::Value::Table(t) => J::Object(t.into_iter().map(|(k, v)| (k, to_json(v))).collect()),
    }
}
