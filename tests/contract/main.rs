//! The store contract: every test here runs against SQLite and, when
//! `JOBDECK_TEST_POSTGRES` names a server, against Postgres, and both must
//! behave identically.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod batches;
mod claims;
mod leases;
mod locks;
mod mixed_cycles;
mod operators;
mod reads;
mod retries;
mod schedules;
mod transitions;
