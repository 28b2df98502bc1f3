//! Where tracing goes: stderr for the CLI and `worker`, a file under the
//! data directory while a console owns the terminal.

use std::path::Path;

use tracing_subscriber::EnvFilter;

/// Log to stderr at `default` level unless `RUST_LOG`/`JOBDECK_LOG` says otherwise.
/// A line that cannot be written is dropped: by default tracing reports the
/// failure with `eprintln!`, which panics when stderr itself is the broken
/// writer (`jobdeck worker 2>&1 | head`, a log collector that went away),
/// killing whichever thread logged, sqlx's connection threads included.
pub fn to_stderr(default: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(default))
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
}

/// Log to `dir/<file>`; the guard must live as long as the process logs.
pub fn to_file(
    dir: &Path,
    file: &str,
) -> std::io::Result<tracing_appender::non_blocking::WorkerGuard> {
    std::fs::create_dir_all(dir)?;
    let appender = tracing_appender::rolling::never(dir, file);
    let (writer, guard) = tracing_appender::non_blocking(appender);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter("info"))
        .with_ansi(false)
        .with_writer(writer)
        // The terminal belongs to the console: a failed write is not
        // reported there either.
        .log_internal_errors(false)
        .try_init();
    Ok(guard)
}

fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_env("JOBDECK_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},sqlx=warn")))
}
