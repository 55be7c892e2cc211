//! The test server, as `solocron_conformance::server` needs it: how to reach
//! MariaDB/MySQL, and how to list the tables and procedures of test prefixes.
#![allow(dead_code)] // Each test binary uses a different part.

use async_trait::async_trait;
use solocron_conformance::server::{self, Failure, TestServer};
use solocron_core::{Prefix, StoreError};
use solocron_mysql::MySqlStore;

/// The MariaDB/MySQL server of `SOLOCRON_TEST_MYSQL_URL`, or the local default.
pub struct MariaDb;

/// A fresh prefix on the test server, uninstalled when dropped.
pub type Namespace = solocron_conformance::server::Namespace<MariaDb>;

#[async_trait]
impl TestServer for MariaDb {
    type Store = MySqlStore;
    const NAME: &'static str = server::MYSQL.name;
    const URL_VAR: &'static str = server::MYSQL.var;
    const URL_DEFAULT: &'static str = server::MYSQL.default;

    async fn connect(url: &str, prefix: &Prefix) -> Result<MySqlStore, StoreError> {
        MySqlStore::connect(url, prefix).await
    }

    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
        let pool = sqlx::MySqlPool::connect(url).await?;
        let names = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
             WHERE table_schema = DATABASE() AND LEFT(table_name, CHAR_LENGTH(?)) = ?
             UNION
             SELECT CAST(routine_name AS CHAR) FROM information_schema.routines
             WHERE routine_schema = DATABASE() AND LEFT(routine_name, CHAR_LENGTH(?)) = ?",
        )
        .bind(root)
        .bind(root)
        .bind(root)
        .bind(root)
        .fetch_all(&pool)
        .await;
        pool.close().await;
        Ok(names?)
    }

    async fn close(store: MySqlStore) {
        store.close().await;
    }
}
