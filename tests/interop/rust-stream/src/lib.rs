//! Empty: the suite is in tests/.
