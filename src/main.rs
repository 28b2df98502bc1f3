use std::process::ExitCode;

use clap::Parser;
use jobdeck::cli::{self, Cli, Command, ConsoleArgs};
use nix::sys::signal::{SigHandler, Signal, signal};

/// glibc's malloc and free cost the engine's thread a sixth of its
/// instructions per job and SQLite's writer thread a fourteenth, much of it
/// freeing on one thread what another allocated (sqlx copies each returned
/// value on its SQLite thread, the engine drops it). With mimalloc, for
/// SQLite's allocations too (`override`, see Cargo.toml): -17 % and -7 %
/// (`bench/instructions.sh`; bench/HISTORY.md, session 28).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The step supervisor is this same binary in a hidden mode; it must start
    // before any runtime or logging is set up.
    if args.get(1).map(String::as_str) == Some("__supervise") {
        return ExitCode::from(jobdeck::engine::supervisor::main(args[2..].to_vec()) as u8);
    }
    let mut cli = Cli::parse();
    end_quietly_on_a_closed_pipe(cli.command.as_ref());
    let runtime = match runtime_for(cli.command.as_ref()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jobdeck: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let config = cli::load_config(cli.config.as_deref())?;
        let command = cli
            .command
            .take()
            .unwrap_or(Command::Console(ConsoleArgs::default()));
        cli::run(cli, config, command).await
    });
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            if let Some(line) = cli::error_line(&e) {
                eprintln!("{line}");
            }
            ExitCode::FAILURE
        }
    }
}

/// A one-shot command is a Unix filter: when the reader of its output goes
/// away (`jobdeck jobs --json | head`), SIGPIPE ends it quietly, as it ends
/// `cat`. Rust ignores SIGPIPE, so the next print panicked instead. The
/// commands that run an engine keep ignoring it: a log reader that goes
/// away must not stop their jobs (their lost lines are dropped, see
/// `cli::logging`).
fn end_quietly_on_a_closed_pipe(command: Option<&Command>) {
    let runs_an_engine = matches!(
        command,
        None | Some(
            Command::Console(_) | Command::Demo(_) | Command::Worker(_) | Command::Bench(_)
        )
    );
    if !runs_an_engine {
        // SAFETY: no other thread exists yet, and SIG_DFL installs no
        // handler code.
        let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    }
}

/// The console draws its frames while its engine runs, so it gets a thread
/// per core. Every other command is the engine alone or a client, waiting
/// on the database and on child processes: on one thread its tasks never
/// wake each other across threads, which took about a tenth of the
/// headless engine's CPU time per job in `jobdeck bench` (bench/HISTORY.md, session 9).
fn runtime_for(command: Option<&Command>) -> std::io::Result<tokio::runtime::Runtime> {
    match command {
        None | Some(Command::Console(_) | Command::Demo(_)) => tokio::runtime::Runtime::new(),
        Some(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
}
