//! The test server, as `solocron_conformance::server` needs it: how to reach PostgreSQL,
//! and how to list the tables and functions of test prefixes.
#![allow(dead_code)] // each test binary uses its own part of this module

use async_trait::async_trait;
use solocron_conformance::server::{self, Failure, TestServer};
use solocron_core::{Prefix, StoreError};
use solocron_postgres::PgStore;

/// The PostgreSQL of `SOLOCRON_TEST_POSTGRES_URL`, or the local trust-auth default.
pub struct Postgres;

/// A fresh prefix on the test server, uninstalled when dropped.
pub type Namespace = solocron_conformance::server::Namespace<Postgres>;

#[async_trait]
impl TestServer for Postgres {
    type Store = PgStore;
    const NAME: &'static str = server::POSTGRES.name;
    const URL_VAR: &'static str = server::POSTGRES.var;
    const URL_DEFAULT: &'static str = server::POSTGRES.default;

    async fn connect(url: &str, prefix: &Prefix) -> Result<PgStore, StoreError> {
        PgStore::connect(url, prefix).await
    }

    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
        let pool = sqlx::PgPool::connect(url).await?;
        let names = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()
               AND left(tablename, length($1)) = $1
             UNION
             SELECT proname::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
               AND left(proname, length($1)) = $1",
        )
        .bind(root)
        .fetch_all(&pool)
        .await;
        pool.close().await;
        Ok(names?)
    }

    async fn close(store: PgStore) {
        store.close().await;
    }
}
