pub mod alarms;
pub mod config;
pub mod data_format;
pub mod fault_injection;
pub mod maintenance;
pub mod memory;
