//! The network edge: sockets, connections, channels and authentication.
