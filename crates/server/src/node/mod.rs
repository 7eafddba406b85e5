//! The node itself, apart from any client: what it is told at start, the resources it watches,
//! the format of its data and the modes an operator puts it in.
//!
//! The map:
//! - [`config`]: what a node is told at start (flags, environment, config file).
//! - [`data_format`]: the format of its data directories, so a build never misreads data a
//!   newer one wrote.
//! - [`alarms`]: memory, disk and storage-failure alarms that block publishers; [`memory`]: the
//!   memory readings they and the metrics take.
//! - [`maintenance`]: `warren ctl drain` / `revive` and SIGTERM's short handover.
//! - [`fault_injection`]: test-only switches that make the disk fail (turned over HTTP by the
//!   management API).
//!
//! These are read by the rest of the crate (through [`crate::Shared`]) and reach into it only to
//! act on the node as a whole (maintenance closes clients and hands over leaderships); their
//! HTTP routes are the management API's, so nothing here imports it.

pub mod alarms;
pub mod config;
pub mod data_format;
pub mod fault_injection;
pub mod maintenance;
pub mod memory;
