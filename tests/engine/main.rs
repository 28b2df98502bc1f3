//! The engine against real processes: `jobdeck worker` binaries, step
//! scripts that write a shared ledger, kill -9, SIGSTOP, a database cut off
//! by a proxy. Every test runs on SQLite and, when `JOBDECK_TEST_POSTGRES`
//! is set, on Postgres in a fresh schema.
//!
//! Lease-sensitive tests use leases of 2–3 s so that expiry is quick; the
//! harness runs at most two tests at a time so that a loaded machine does
//! not blur those timings.

mod harness;

mod exclusivity;
mod scripts;

mod control;
mod crash;
mod fencing;
mod scheduler;
mod shutdown;
mod slots;
mod sqlite_load;
mod steps;
mod wakeups;
