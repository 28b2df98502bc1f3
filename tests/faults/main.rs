//! Fault injection on real processes and real databases: workers killed by
//! the dozen, a Postgres server restarted under them, a frozen worker, SIGKILL
//! in the middle of SQLite writes, hung steps, cancels at random moments, a
//! scheduler on three nodes. Every scenario is checked twice: by a ledger the
//! jobs' own steps append to (`start|end TARGET JOB ATTEMPT FENCE NS PID`,
//! one write per line) and by an audit of the database at the end.
//!
//! The process harness is the engine suite's (`tests/engine/harness`), so
//! both suites start workers, pin the binary and make databases alike.
//! Sizes fit a 2-core machine: leases of 2–3 s, a kill every ~2 s.

#[path = "../engine/harness/mod.rs"]
mod harness;

mod audit;
mod cluster;

mod cancel_races;
mod db_restart;
mod partition;
mod scheduler;
mod slow_steps;
mod sqlite_crash;
mod storm;
