//! The store conformance suite against MariaDB/MySQL: each test gets a fresh table prefix,
//! and each store the suite opens is a separate `MySqlStore` (its own pool) on it, as a
//! separate process would hold. Skips when the server is unreachable, unless `CI` is set.

mod support;

solocron_conformance::conformance_tests!(support::namespace());
