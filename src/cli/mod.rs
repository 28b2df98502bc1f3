//! Command-line entry: resolve config and database, then run one command.

mod args;
mod bench;
mod bench_scale;
mod commands;
mod console_cmd;
pub mod logging;
mod output;
mod worker;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use args::{Cli, Command, ConsoleArgs, parse_duration};
pub use worker::data_dir;

use crate::config::{self, Config};
use crate::store::{self, Store};

/// An error already reported to the user; only the exit status is left.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported")
    }
}

impl std::error::Error for Reported {}

const DEFAULT_DB: &str = "sqlite://jobdeck.db";

/// `--config FILE`, else `./jobdeck.toml` when present, else no pipelines.
pub fn load_config(path: Option<&Path>) -> Result<Config> {
    let path: Option<PathBuf> = match path {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("jobdeck.toml")).filter(|p| p.exists()),
    };
    match path {
        Some(p) => Ok(config::load(&p)?),
        None => Ok(Config::default_empty()),
    }
}

/// `--db` (or `JOBDECK_DB`) > `[database] url` > `sqlite://jobdeck.db`.
pub fn database_url(cli_db: Option<&str>, config: &Config) -> String {
    cli_db
        .map(str::to_string)
        .or_else(|| config.database.url.clone())
        .unwrap_or_else(|| DEFAULT_DB.to_string())
}

pub async fn connect(url: &str) -> Result<Store> {
    within_timeout(url, store::connect(url)).await
}

/// [`connect`] for a node that runs an engine of `slots` slots: its
/// connection pool is sized to them.
pub async fn connect_for_slots(url: &str, slots: usize) -> Result<Store> {
    within_timeout(url, store::connect_for_slots(url, slots)).await
}

/// [`connect`] for a command whose statements run one after another
/// (see [`store::connect_one_shot`]).
pub async fn connect_one_shot(url: &str) -> Result<Store> {
    within_timeout(url, store::connect_one_shot(url)).await
}

/// The backends time out on their own; this guards against a hang
/// anywhere else (name resolution, a stuck TLS handshake).
async fn within_timeout(
    url: &str,
    connecting: impl Future<Output = store::Result<Store>>,
) -> Result<Store> {
    match tokio::time::timeout(store::CONNECT_TIMEOUT * 2, connecting).await {
        Ok(r) => Ok(r?),
        Err(_) => anyhow::bail!(
            "database unreachable: {}: no answer within {}s",
            store::redact_url(url),
            (store::CONNECT_TIMEOUT * 2).as_secs()
        ),
    }
}

/// Run one command; returns the process exit code.
pub async fn run(cli: Cli, config: Config, command: Command) -> Result<i32> {
    match command {
        Command::Bench(a) => {
            logging::to_stderr("warn");
            return bench::run(cli.db, a).await;
        }
        Command::Demo(a) => {
            let config = console_cmd::demo_config()?;
            let slots = config.workers.slots;
            let store = connect_for_slots(&console_cmd::demo_url(cli.db.as_deref()), slots).await?;
            return console_cmd::demo(store, config, a).await;
        }
        Command::Console(_) => {}
        Command::Worker(_) => logging::to_stderr("info"),
        _ => logging::to_stderr("warn"),
    }
    let url = database_url(cli.db.as_deref(), &config);
    let engine_slots = |slots: Option<u32>| slots.map_or(config.workers.slots, |n| n as usize);
    // An engine's pool is sized to its slots; the console reads several
    // things at once; the other commands run their statements one by one.
    let store = match &command {
        Command::Worker(a) => connect_for_slots(&url, engine_slots(a.slots)).await?,
        Command::Console(a) if !a.no_workers => {
            connect_for_slots(&url, engine_slots(a.slots)).await?
        }
        Command::Console(_) => connect(&url).await?,
        _ => connect_one_shot(&url).await?,
    };
    match command {
        Command::Console(a) => return console_cmd::console(store, config, a).await,
        Command::Migrate => println!("database {} is up to date", store.display_url()),
        Command::Enqueue(a) => commands::enqueue(&store, &config, a).await?,
        Command::Jobs(a) => commands::jobs(&store, a).await?,
        Command::Show { id, json } => commands::show(&store, id, json).await?,
        Command::Cancel(a) => commands::cancel(&store, &a.ids, a.json).await?,
        Command::Requeue(a) => commands::requeue(&store, &a.ids, a.json).await?,
        Command::Extend { ids, by, json } => {
            commands::extend(&store, &config, &ids, by, json).await?
        }
        Command::Release { target, json } => commands::release(&store, &target, json).await?,
        Command::Locks(f) => commands::locks(&store, f.json).await?,
        Command::Workers(f) => commands::workers(&store, f.json).await?,
        Command::Stats(f) => commands::stats(&store, f.json).await?,
        Command::Schedules(f) => commands::schedules(&store, f.json).await?,
        Command::Schedule { action } => commands::schedule(&store, action).await?,
        Command::Wait { ids, timeout } => return commands::wait(&store, &ids, timeout).await,
        Command::Worker(a) => return worker::run(store, config, a).await,
        Command::Bench(_) | Command::Demo(_) => unreachable!("handled above"),
    }
    Ok(0)
}

/// The one line printed for a failed command.
pub fn error_line(e: &anyhow::Error) -> Option<String> {
    if e.downcast_ref::<Reported>().is_some() {
        return None;
    }
    Some(format!("jobdeck: {e:#}").replace('\n', " "))
}

/// Context helper for reading files named on the command line.
pub fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}
