//! placeholder being written
