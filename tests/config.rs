//! jobdeck.toml: every refusal names file, line, place and key on one line;
//! the shipped configs load; defaults, cron and substitution behave.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use jobdeck::config::{
    self, Builtin, Config, LockBusyPolicy, Overlap, StepAction, WorkersConfig, parse, substitute,
};
use jobdeck::job::StalePolicy;

/// A valid pipeline named "sync" with one step "copy"; step keys may follow.
const SYNC: &str = "\
[[pipeline]]
name = \"sync\"
[[pipeline.step]]
name = \"copy\"
";

fn error_of(text: &str) -> String {
    match parse(text, "jobdeck.toml") {
        Ok(c) => panic!("expected an error, got {c:#?}"),
        Err(e) => e.to_string(),
    }
}

/// The error is one line, starts with `jobdeck.toml:LINE: ` and contains
/// every needle (the place, the key, the problem).
#[track_caller]
fn assert_error(text: &str, line: usize, needles: &[&str]) {
    let msg = error_of(text);
    assert!(!msg.contains('\n'), "not one line: {msg:?}");
    let prefix = format!("jobdeck.toml:{line}: ");
    assert!(
        msg.starts_with(&prefix),
        "expected {prefix:?}…, got {msg:?}"
    );
    for n in needles {
        assert!(msg.contains(n), "expected {n:?} in {msg:?}");
    }
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

// ---------- refusals ----------

#[test]
fn toml_syntax_error() {
    assert_error(
        "[workers]\nslots = 4\nlease = \"30s\n",
        3,
        &["invalid TOML"],
    );
}

#[test]
fn unknown_key_in_a_step_names_pipeline_step_and_key() {
    let text = format!("{SYNC}runn = [\"cp\"]\n");
    let msg = error_of(&text);
    assert!(
        msg.starts_with("jobdeck.toml:5: pipeline \"sync\": step \"copy\": unknown key `runn`"),
        "{msg}"
    );
}

#[test]
fn unknown_keys_everywhere() {
    assert_error(
        "[workers]\nslot = 4\n",
        2,
        &["workers", "unknown key `slot`"],
    );
    assert_error("[workerz]\nslots = 4\n", 1, &["unknown key `workerz`"]);
    assert_error(
        "[database]\nurl = \"sqlite://x.db\"\npassword = \"x\"\n",
        3,
        &["database", "unknown key `password`"],
    );
    assert_error(
        "[[pipeline]]\nname = \"sync\"\nretries = 3\n[[pipeline.step]]\nname = \"a\"\nbuiltin = \"noop\"\n",
        3,
        &["pipeline \"sync\"", "unknown key `retries`"],
    );
    let text = format!(
        "{SYNC}builtin = \"noop\"\n[[schedule]]\nname = \"nightly\"\npipeline = \"sync\"\ncron = \"* * * * *\"\ntz = \"UTC\"\n"
    );
    assert_error(&text, 10, &["schedule \"nightly\"", "unknown key `tz`"]);
}

#[test]
fn wrong_type() {
    assert_error(
        "[workers]\nslots = \"four\"\n",
        2,
        &["workers: slots", "invalid type"],
    );
    assert_error(
        &format!("{SYNC}run = \"cp a b\"\n"),
        5,
        &["step \"copy\": run", "invalid type"],
    );
    assert_error(
        "[workers]\nlease = 30\n",
        2,
        &["workers: lease", "duration string"],
    );
}

#[test]
fn negative_or_malformed_durations() {
    assert_error(
        "[workers]\nslots = 2\nlease = \"-5s\"\n",
        3,
        &["workers: lease", "negative"],
    );
    assert_error(
        "[[pipeline]]\nname = \"sync\"\nbackoff = \"5 parsecs\"\n[[pipeline.step]]\nname = \"a\"\nbuiltin = \"noop\"\n",
        3,
        &["pipeline \"sync\": backoff", "unknown time unit"],
    );
    assert_error(
        &format!("{SYNC}builtin = \"sleep\"\nduration = \"soon\"\n"),
        6,
        &["step \"copy\": duration", "invalid duration"],
    );
}

#[test]
fn zero_slots_and_attempts() {
    assert_error(
        "[workers]\nslots = 0\n",
        2,
        &["workers: slots", "at least 1"],
    );
    assert_error(
        "[workers]\nslots = 8\ncycles_in_flight = 0\n",
        3,
        &["workers: cycles_in_flight", "at least 1 (got 0)"],
    );
    assert_error(
        "[[pipeline]]\nname = \"sync\"\nmax_attempts = 0\n[[pipeline.step]]\nname = \"a\"\nbuiltin = \"noop\"\n",
        3,
        &["pipeline \"sync\": max_attempts", "at least 1"],
    );
}

#[test]
fn probabilities_outside_zero_one() {
    assert_error(
        &format!("{SYNC}builtin = \"fail\"\nprobability = 1.5\n"),
        6,
        &["step \"copy\": probability", "between 0 and 1"],
    );
    assert_error(
        &format!("{SYNC}builtin = \"sleep\"\nduration = \"1s\"\nfail_probability = -0.1\n"),
        7,
        &["step \"copy\": fail_probability", "between 0 and 1"],
    );
}

#[test]
fn a_step_is_run_or_builtin() {
    assert_error(
        &format!("{SYNC}run = [\"true\"]\nbuiltin = \"noop\"\n"),
        6,
        &["step \"copy\": builtin", "not both"],
    );
    assert_error(
        &format!("{SYNC}timeout = \"1m\"\n"),
        3,
        &["step \"copy\"", "`run`", "`builtin`"],
    );
    assert_error(
        &format!("{SYNC}run = []\n"),
        5,
        &["step \"copy\": run", "empty"],
    );
    assert_error(
        &format!("{SYNC}builtin = \"explode\"\n"),
        5,
        &["step \"copy\": builtin", "unknown builtin \"explode\""],
    );
    // Keys of the other kind of step are mistakes, not silently ignored.
    assert_error(
        &format!("{SYNC}builtin = \"noop\"\ncwd = \"/tmp\"\n"),
        6,
        &["step \"copy\": cwd"],
    );
    assert_error(
        &format!("{SYNC}builtin = \"noop\"\nduration = \"1s\"\n"),
        6,
        &["step \"copy\": duration", "does not apply"],
    );
    assert_error(
        &format!("{SYNC}run = [\"cp\", \"{{taget}}\"]\n"),
        5,
        &["step \"copy\": run", "unknown placeholder `{taget}`"],
    );
}

#[test]
fn pipeline_without_steps() {
    assert_error(
        "[workers]\nslots = 1\n\n[[pipeline]]\nname = \"empty\"\n",
        4,
        &["pipeline \"empty\"", "no steps"],
    );
}

#[test]
fn duplicate_names() {
    let text = format!("{SYNC}builtin = \"noop\"\n{SYNC}builtin = \"noop\"\n");
    assert_error(
        &text,
        7,
        &["pipeline \"sync\": name", "duplicate", "line 2"],
    );
    let schedule = "[[schedule]]\nname = \"tick\"\npipeline = \"sync\"\ncron = \"* * * * * *\"\n";
    let text = format!("{SYNC}builtin = \"noop\"\n{schedule}{schedule}");
    assert_error(&text, 11, &["schedule \"tick\": name", "duplicate"]);
}

#[test]
fn schedule_refusals() {
    let sched = |extra: &str| {
        format!(
            "{SYNC}builtin = \"noop\"\n[[schedule]]\nname = \"tick\"\npipeline = \"sync\"\ncron = \"*/5 * * * * *\"\n{extra}"
        )
    };
    assert_error(
        &sched("").replace("pipeline = \"sync\"\ncron", "pipeline = \"synk\"\ncron"),
        8,
        &[
            "schedule \"tick\": pipeline",
            "unknown pipeline \"synk\"",
            "sync",
        ],
    );
    assert_error(
        &sched("").replace("*/5 * * * * *", "every five seconds"),
        9,
        &["schedule \"tick\": cron", "invalid cron"],
    );
    assert_error(
        &sched("").replace("*/5 * * * * *", "0 0 0 1 1 * 2030"),
        9,
        &["schedule \"tick\": cron"],
    );
    assert_error(
        &sched("timezone = \"Mars/Olympus\"\n"),
        10,
        &[
            "schedule \"tick\": timezone",
            "unknown time zone \"Mars/Olympus\"",
        ],
    );
}

#[test]
fn schedule_must_supply_what_the_commands_use() {
    let text = "\
[[pipeline]]
name = \"copy\"
[[pipeline.step]]
name = \"cp\"
run = [\"cp\", \"{target}\", \"{arg.dest}\"]
[[schedule]]
name = \"nightly\"
pipeline = \"copy\"
cron = \"0 0 3 * * *\"
";
    assert_error(text, 7, &["schedule \"nightly\": target", "{target}"]);
    let with_target = text.replace("cron", "target = \"a\"\ncron");
    assert_error(&with_target, 7, &["schedule \"nightly\": args", "`dest`"]);
    let complete = with_target.replace("cron", "args = { dest = \"/b\" }\ncron");
    parse(&complete, "jobdeck.toml").unwrap();
}

#[test]
fn load_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[workers]\nslots = -1\n").unwrap();
    let msg = config::load(&path).unwrap_err().to_string();
    assert_eq!(
        msg,
        format!(
            "{}:2: workers: slots: must be at least 1 (got -1)",
            path.display()
        )
    );
    let missing = config::load(&dir.path().join("nope.toml")).unwrap_err();
    assert!(
        missing.to_string().contains("nope.toml: cannot read"),
        "{missing}"
    );
    assert_eq!(missing.line(), None);
}

// ---------- valid configs ----------

#[test]
fn defaults() {
    let c = parse("", "jobdeck.toml").unwrap();
    assert_eq!(c, Config::default_empty());
    let w = WorkersConfig::default();
    assert_eq!(w.slots, 4);
    assert_eq!(w.cycles_in_flight, 1);
    assert_eq!(w.busy_poll, Duration::ZERO);
    assert_eq!(w.lease, Duration::from_secs(30));
    assert_eq!(w.poll, Duration::from_millis(200));
    assert_eq!(w.kill_grace, Duration::from_secs(10));
    assert_eq!(w.drain_grace, Duration::from_secs(30));
    assert_eq!(w.retention, Duration::from_secs(7 * 86400));
    assert_eq!(w.renew_every(), Duration::from_secs(10));
    assert_eq!(w.reaper_every(), Duration::from_secs(5));
    assert_eq!(w.stale_grace(), Duration::from_secs(3));
    assert_eq!(w.supervisor_margin(), Duration::from_millis(7500));
    let short = WorkersConfig {
        lease: Duration::from_secs(6),
        ..w
    };
    assert_eq!(short.reaper_every(), Duration::from_secs(2));
    assert_eq!(short.stale_grace(), Duration::from_secs(2));

    let text = format!(
        "{SYNC}builtin = \"sleep\"\nduration = \"2s\"\n[[pipeline.step]]\nname = \"boom\"\nbuiltin = \"fail\"\n\
         [[schedule]]\nname = \"tick\"\npipeline = \"sync\"\ncron = \"* * * * *\"\n"
    );
    let c = parse(&text, "jobdeck.toml").unwrap();
    let p = c.pipeline("sync").unwrap();
    assert_eq!(p.max_attempts, 3);
    assert_eq!(p.backoff, Duration::from_secs(5));
    assert_eq!(p.timeout, None);
    assert_eq!(p.on_lock_busy, LockBusyPolicy::Requeue);
    assert_eq!(p.lock_wait, Duration::from_secs(60));
    assert_eq!(p.on_stale, StalePolicy::Hold);
    assert_eq!(
        p.steps[0].action,
        StepAction::Builtin(Builtin::Sleep {
            duration: Duration::from_secs(2),
            fail_probability: 0.0
        })
    );
    assert_eq!(
        p.steps[1].action,
        StepAction::Builtin(Builtin::Fail { probability: 1.0 })
    );
    let s = &c.schedules[0];
    assert_eq!(s.timezone, "UTC");
    assert_eq!(s.overlap, Overlap::Skip);
    assert!(s.enabled);
    assert_eq!(s.target, None);
    assert!(s.args.is_empty());
    assert_eq!(c.pipeline_names(), ["sync"]);
    assert!(c.pipeline("nope").is_none());
}

#[test]
fn cycles_in_flight_is_read() {
    let c = parse("[workers]\ncycles_in_flight = 3\n", "jobdeck.toml").unwrap();
    assert_eq!(c.workers.cycles_in_flight, 3);
    assert_eq!(c.workers.slots, 4);
}

#[test]
fn busy_poll_is_read() {
    let c = parse("[workers]\nbusy_poll = \"2ms\"\n", "jobdeck.toml").unwrap();
    assert_eq!(c.workers.busy_poll, Duration::from_millis(2));
    assert_error(
        "[workers]\nbusy_poll = \"briefly\"\n",
        2,
        &["busy_poll", "invalid duration"],
    );
}

fn asset(name: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets")
        .join(name);
    config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn annotated_example_loads_with_every_key() {
    let c = asset("jobdeck.toml");
    assert!(c.source.as_ref().unwrap().ends_with("assets/jobdeck.toml"));
    assert_eq!(c.database.url.as_deref(), Some("sqlite://jobdeck.db"));
    assert_eq!(c.workers, WorkersConfig::default());
    let p = c.pipeline("dataset-sync").unwrap();
    assert_eq!(p.timeout, Some(Duration::from_secs(3600)));
    assert_eq!(p.steps.len(), 2);
    let StepAction::Command { run, cwd, env } = &p.steps[0].action else {
        panic!("sync is a command");
    };
    assert_eq!(run[0], "rsync");
    assert_eq!(cwd.as_deref(), Some(Path::new("/srv/data")));
    assert!(env.contains_key("RSYNC_RSH"));
    assert_eq!(p.steps[0].timeout, Some(Duration::from_secs(1800)));
    assert!(p.needs_target());
    assert_eq!(p.arg_names().into_iter().collect::<Vec<_>>(), ["dest"]);
    let b = c.pipeline("builtins").unwrap();
    let kinds: Vec<&str> = b
        .steps
        .iter()
        .map(|s| match &s.action {
            StepAction::Builtin(b) => b.name(),
            StepAction::Command { .. } => "command",
        })
        .collect();
    assert_eq!(kinds, ["noop", "sleep", "fail", "hang"]);
    let s = &c.schedules[0];
    assert_eq!(s.timezone, "Europe/Paris");
    assert_eq!(s.args["dest"], "/backup");
}

#[test]
fn demo_loads() {
    let c = asset("demo.toml");
    assert_eq!(c.workers.slots, 4);
    assert_eq!(c.workers.lease, Duration::from_secs(6));
    let d = c.pipeline("dataset").unwrap();
    let steps: Vec<&str> = d.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(steps, ["sync", "verify", "retention", "harvest"]);
    assert_eq!(d.on_stale, StalePolicy::Hold);
    assert_eq!(d.max_attempts, 3);
    assert_eq!(d.backoff, Duration::from_secs(3));
    assert_eq!(
        c.pipeline("stuck").unwrap().steps[0].action,
        StepAction::Builtin(Builtin::Hang)
    );
    let every5 = c
        .schedules
        .iter()
        .find(|s| s.pipeline == "dataset")
        .unwrap();
    assert_eq!(every5.cron, "*/5 * * * * *");
    assert_eq!(every5.target.as_deref(), Some("dataset-a"));
    let report = c.schedules.iter().find(|s| s.pipeline == "report").unwrap();
    assert_eq!(report.target, None);
}

// ---------- cron ----------

#[test]
fn per_second_cron() {
    let c = asset("demo.toml");
    let s = c
        .schedules
        .iter()
        .find(|s| s.pipeline == "dataset")
        .unwrap();
    assert_eq!(
        s.next_fire_after(at("2026-03-01T12:00:03Z")),
        Some(at("2026-03-01T12:00:05Z"))
    );
    // Strictly after: a fire time is not its own next fire.
    assert_eq!(
        s.next_fire_after(at("2026-03-01T12:00:05Z")),
        Some(at("2026-03-01T12:00:10Z"))
    );
    assert_eq!(
        s.next_fire_after(at("2026-03-01T12:00:09.500Z")),
        Some(at("2026-03-01T12:00:10Z"))
    );
}

#[test]
fn five_field_cron_and_timezone() {
    let text = format!(
        "{SYNC}builtin = \"noop\"\n[[schedule]]\nname = \"paris\"\npipeline = \"sync\"\ncron = \"30 2 * * *\"\ntimezone = \"Europe/Paris\"\n"
    );
    let c = parse(&text, "jobdeck.toml").unwrap();
    let s = &c.schedules[0];
    // Winter: Paris is UTC+1, so 02:30 Paris = 01:30 UTC.
    assert_eq!(
        s.next_fire_after(at("2026-01-10T12:00:00Z")),
        Some(Utc.with_ymd_and_hms(2026, 1, 11, 1, 30, 0).unwrap())
    );
    // Summer: UTC+2.
    assert_eq!(
        s.next_fire_after(at("2026-07-10T12:00:00Z")),
        Some(Utc.with_ymd_and_hms(2026, 7, 11, 0, 30, 0).unwrap())
    );
    let utc = config::Schedule {
        timezone: "UTC".into(),
        ..s.clone()
    };
    assert_eq!(
        utc.next_fire_after(at("2026-01-10T12:00:00Z")),
        Some(Utc.with_ymd_and_hms(2026, 1, 11, 2, 30, 0).unwrap())
    );
}

// ---------- substitution ----------

fn args(pairs: &[(&str, serde_json::Value)]) -> serde_json::Map<String, serde_json::Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn argv(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn substitute_fills_target_and_args() {
    let a = args(&[("dest", "/backup".into()), ("days", 7.into())]);
    let out = substitute(
        &argv(&["sync", "--to={arg.dest}/{target}", "{arg.days}", "{target}"]),
        Some("ds-1"),
        &a,
    )
    .unwrap();
    assert_eq!(out, ["sync", "--to=/backup/ds-1", "7", "ds-1"]);
}

#[test]
fn substitute_leaves_shell_metacharacters_alone() {
    let evil = "x; rm -rf / $(whoami) `id` | tee >out && echo '\"'";
    let a = args(&[("note", evil.into())]);
    let out = substitute(&argv(&["echo", "{arg.note}", "{target}"]), Some("a b*"), &a).unwrap();
    // Each stays exactly one argument, byte for byte.
    assert_eq!(out, ["echo", evil, "a b*"]);
    let out = substitute(&argv(&["sh", "-c", "echo $HOME; ls *"]), None, &a).unwrap();
    assert_eq!(out[2], "echo $HOME; ls *");
}

#[test]
fn substitute_escapes_and_errors() {
    let none = serde_json::Map::new();
    assert_eq!(
        substitute(&argv(&["jq", "{{.a}}", "}}{{"]), None, &none).unwrap(),
        ["jq", "{.a}", "}{"]
    );
    let e = substitute(&argv(&["cp", "{arg.src}"]), None, &none).unwrap_err();
    assert!(e.contains("`src`"), "{e}");
    let e = substitute(&argv(&["cp", "{target}"]), None, &none).unwrap_err();
    assert!(e.contains("no target"), "{e}");
    assert!(substitute(&argv(&["cp", "{tar"]), None, &none).is_err());
    assert!(substitute(&argv(&["cp", "a}b"]), None, &none).is_err());
    assert!(substitute(&argv(&["cp", "{targets}"]), Some("t"), &none).is_err());
    // A value is never re-scanned for placeholders.
    let a = args(&[("x", "{target}".into())]);
    assert_eq!(
        substitute(&argv(&["{arg.x}"]), Some("t"), &a).unwrap(),
        ["{target}"]
    );
    assert_eq!(
        substitute(&argv(&["é{target}ü{{"]), Some("ß"), &a).unwrap(),
        ["éßü{"]
    );
}

#[test]
fn type_errors_speak_toml_not_rust() {
    assert_error(
        "workers = 3\n",
        1,
        &["workers: invalid type: integer `3`, expected a table"],
    );
    assert_error(
        "[pipeline]\nname = \"x\"\n",
        1,
        &[
            "pipeline: invalid type: table, expected an array",
            "[[name]]",
        ],
    );
    assert_error(
        "[[pipeline]]\nname = \"p\"\nmax_attempts = 1.5\n[[pipeline.step]]\nname = \"a\"\nbuiltin = \"noop\"\n",
        3,
        &["max_attempts: invalid type: float `1.5`, expected an integer"],
    );
    assert_error(
        "[workers]\nslots = 99999999999999999999\n",
        2,
        &["workers: slots: integer out of range"],
    );
    assert_error(
        "[[pipeline]]\nname = \"p\"\non_stale = \"later\"\n[[pipeline.step]]\nname = \"a\"\nbuiltin = \"noop\"\n",
        3,
        &[
            "pipeline \"p\": on_stale: unknown value `later`, expected one of `hold`, `release`, `retry`",
        ],
    );
}
