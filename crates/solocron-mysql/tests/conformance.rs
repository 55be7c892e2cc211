//! The store conformance suite against MariaDB/MySQL: each test gets a fresh prefix,
//! and each store the suite opens is a separate `MySqlStore` (its own pool) on it, as a
//! separate process would hold. Skips when the server is unreachable, unless `CI` is set.
#![forbid(unsafe_code)]

mod support;

solocron_conformance::conformance_tests!(support::Namespace::new());
