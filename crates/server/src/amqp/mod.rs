pub mod access;
pub mod channel;
mod confirms;
pub mod connection;
pub mod flow;
mod handshake;
pub mod registry;
pub mod transactions;
pub mod writer;
