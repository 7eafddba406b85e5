//! AMQP 0-9-1 codec: frames, methods and content headers, with no I/O.
