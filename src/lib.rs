//! jobdeck: a database-backed queue for long-running data jobs, with a live
//! terminal console. See DESIGN.md for the contract.

pub mod cli;
pub mod config;
pub mod console;
pub mod engine;
pub mod job;
pub mod store;
