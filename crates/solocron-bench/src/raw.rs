//! The store's raw minimal operation, for the claim-overhead comparison, and cleanup.

use solocron_core::Prefix;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{MySqlPool, PgPool, SqlitePool};

/// How long a raw Redis key lives: longer than a claim scenario's round, after which the
/// keys go by themselves (no cleanup to get wrong).
const REDIS_RAW_KEY_TTL_MS: u64 = 60_000;

/// Keys per `UNLINK`.
const REDIS_UNLINK_KEYS_MAX: usize = 1000;

/// Operations per etcd `Txn`: the server's default `--max-txn-ops`, as the etcd store's.
#[cfg(feature = "etcd")]
const ETCD_TXN_OPS_MAX: usize = 128;

/// A batch's etcd `Txn`s in flight at once, as the etcd store's claim chunks.
#[cfg(feature = "etcd")]
const ETCD_TXNS_IN_FLIGHT: usize = 4;

/// A direct connection doing the store's cheapest "insert if absent", into a table or under
/// keys named from the run's [`Prefix`] as the store spells it (`<table prefix>raw`,
/// `<key prefix>raw:`, `<key prefix>raw/`).
///
/// Its pools are set up like the stores' own: in particular, no ping before each use
/// (`test_before_acquire(false)`, as every SQL store of solocron sets), or every raw
/// insert would pay one more round trip than the claim it is compared with.
pub enum Raw {
    /// The pool and the raw table's name.
    Sqlite(SqlitePool, String),
    /// The pool and the raw table's name.
    Postgres(PgPool, String),
    /// The pool and the raw table's name.
    MySql(MySqlPool, String),
    /// The connection and what every raw key starts with.
    Redis(redis::aio::ConnectionManager, String),
    /// The client and what every raw key starts with.
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::Client>, String),
}

impl Raw {
    /// Connects to the store at `url` and creates the raw table (SQL stores).
    pub async fn connect(url: &str, prefix: &Prefix) -> anyhow::Result<Raw> {
        let table = format!("{}raw", prefix.table_prefix());
        let raw = if url.starts_with("sqlite") {
            // The store's own settings (WAL, `synchronous = NORMAL`: no fsync per commit), so
            // that the comparison is of the operations, not of the durability settings.
            let options = url
                .parse::<SqliteConnectOptions>()?
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(std::time::Duration::from_secs(5));
            let pool = SqlitePoolOptions::new().test_before_acquire(false).connect_with(options).await?;
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY)")).execute(&pool).await?;
            Raw::Sqlite(pool, table)
        } else if url.starts_with("postgres") {
            let pool = PgPoolOptions::new().test_before_acquire(false).connect(url).await?;
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY)")).execute(&pool).await?;
            Raw::Postgres(pool, table)
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            let pool = MySqlPoolOptions::new()
                .test_before_acquire(false)
                .connect(&url.replacen("mariadb://", "mysql://", 1))
                .await?;
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {table} (k VARCHAR(64) PRIMARY KEY)"))
                .execute(&pool)
                .await?;
            Raw::MySql(pool, table)
        } else if url.starts_with("redis") {
            let client = redis::Client::open(url)?;
            let keys = format!("{}raw:", prefix.redis_key_prefix());
            Raw::Redis(redis::aio::ConnectionManager::new(client).await?, keys)
        } else if url.starts_with("etcd") {
            #[cfg(feature = "etcd")]
            {
                let client = etcd_client::Client::connect(etcd_endpoints(url), None).await?;
                Raw::Etcd(Box::new(client), format!("{}raw/", prefix.etcd_key_prefix()))
            }
            #[cfg(not(feature = "etcd"))]
            anyhow::bail!("this build has no etcd: build the benchmark with `--features etcd`")
        } else {
            anyhow::bail!("no raw operation for {}", solocron_core::redact_url(url))
        };
        Ok(raw)
    }

    /// One insert-if-absent of `k`: SQLite `INSERT OR IGNORE`, PostgreSQL `INSERT … ON
    /// CONFLICT DO NOTHING RETURNING`, MySQL `INSERT IGNORE`, Redis `SET k v NX PX`, etcd one
    /// `Txn` (create revision 0 → put).
    pub async fn insert(&self, k: &str) -> anyhow::Result<()> {
        match self {
            Raw::Sqlite(p, table) => {
                sqlx::query(&format!("INSERT OR IGNORE INTO {table} (k) VALUES (?)")).bind(k).execute(p).await?;
            }
            Raw::Postgres(p, table) => {
                sqlx::query(&format!("INSERT INTO {table} (k) VALUES ($1) ON CONFLICT DO NOTHING RETURNING k"))
                    .bind(k)
                    .fetch_optional(p)
                    .await?;
            }
            Raw::MySql(p, table) => {
                sqlx::query(&format!("INSERT IGNORE INTO {table} (k) VALUES (?)")).bind(k).execute(p).await?;
            }
            Raw::Redis(c, keys) => {
                let mut c = c.clone();
                let _: Option<String> = redis::cmd("SET")
                    .arg(format!("{keys}{k}"))
                    .arg("1")
                    .arg("NX")
                    .arg("PX")
                    .arg(REDIS_RAW_KEY_TTL_MS)
                    .query_async(&mut c)
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Raw::Etcd(c, keys) => {
                use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
                let key = format!("{keys}{k}");
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), "1", Some(PutOptions::new()))]);
                c.kv_client().txn(txn).await?;
            }
        }
        Ok(())
    }

    /// Inserts every one of `ks` (absent keys) in one statement or pipeline, as a node claims
    /// a second's ticks in one call: SQLite and MySQL one multi-row `INSERT OR IGNORE` /
    /// `INSERT IGNORE`, PostgreSQL one `INSERT … SELECT unnest($1) ON CONFLICT DO NOTHING
    /// RETURNING` (its claim's arrays), Redis one pipeline of `SET NX PX`, etcd `Txn`s of at
    /// most [`ETCD_TXN_OPS_MAX`] create-if-absent, [`ETCD_TXNS_IN_FLIGHT`] at once (its
    /// claim's chunks).
    pub async fn insert_batch(&self, ks: &[String]) -> anyhow::Result<()> {
        let values = |mark: &str| vec![format!("({mark})"); ks.len()].join(", ");
        match self {
            Raw::Sqlite(p, table) => {
                let sql = format!("INSERT OR IGNORE INTO {table} (k) VALUES {}", values("?"));
                ks.iter().fold(sqlx::query(&sql), |q, k| q.bind(k)).execute(p).await?;
            }
            Raw::Postgres(p, table) => {
                let sql =
                    format!("INSERT INTO {table} (k) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING k");
                sqlx::query(&sql).bind(ks).fetch_all(p).await?;
            }
            Raw::MySql(p, table) => {
                let sql = format!("INSERT IGNORE INTO {table} (k) VALUES {}", values("?"));
                ks.iter().fold(sqlx::query(&sql), |q, k| q.bind(k)).execute(p).await?;
            }
            Raw::Redis(c, keys) => {
                let mut pipe = redis::pipe();
                for k in ks {
                    pipe.cmd("SET").arg(format!("{keys}{k}")).arg("1").arg("NX").arg("PX").arg(REDIS_RAW_KEY_TTL_MS);
                }
                let _: Vec<Option<String>> = pipe.query_async(&mut c.clone()).await?;
            }
            #[cfg(feature = "etcd")]
            Raw::Etcd(c, keys) => etcd_batch(c, keys, ks).await?,
        }
        Ok(())
    }

    /// Unlinks Redis keys made by [`Raw::insert`] or [`Raw::insert_batch`] at once, where
    /// many would otherwise expire during a later measurement; nothing for the other stores,
    /// whose raw table or keys [`Raw::remove`] removes.
    pub async fn unlink(&self, ks: &[String]) -> anyhow::Result<()> {
        let Raw::Redis(c, keys) = self else { return Ok(()) };
        for chunk in ks.chunks(REDIS_UNLINK_KEYS_MAX) {
            let full: Vec<String> = chunk.iter().map(|k| format!("{keys}{k}")).collect();
            let _: u64 = redis::cmd("UNLINK").arg(full).query_async(&mut c.clone()).await?;
        }
        Ok(())
    }

    /// Removes the raw table or keys. Redis keys are left to expire
    /// ([`REDIS_RAW_KEY_TTL_MS`]).
    pub async fn remove(&self) -> anyhow::Result<()> {
        let drop_table = |table: &str| format!("DROP TABLE IF EXISTS {table}");
        match self {
            Raw::Sqlite(p, table) => {
                sqlx::query(&drop_table(table)).execute(p).await?;
            }
            Raw::Postgres(p, table) => {
                sqlx::query(&drop_table(table)).execute(p).await?;
            }
            Raw::MySql(p, table) => {
                sqlx::query(&drop_table(table)).execute(p).await?;
            }
            Raw::Redis(..) => {}
            #[cfg(feature = "etcd")]
            Raw::Etcd(c, keys) => {
                let mut kv = c.kv_client();
                kv.delete(keys.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix())).await?;
            }
        }
        Ok(())
    }
}

/// Brings a freshly filled namespace to the state a store in service is in: on
/// PostgreSQL, `ANALYZE` of its tables (what autovacuum does within a minute of a bulk load;
/// test servers may run with autovacuum off, and the planner's choices for an unanalyzed
/// table are not the ones production sees). Nothing for the other stores.
pub async fn settle(url: &str, prefix: &Prefix) -> anyhow::Result<()> {
    if !url.starts_with("postgres") {
        return Ok(());
    }
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let like = format!("{}%", prefix.table_prefix().replace('_', "\\_"));
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1")
            .bind(&like)
            .fetch_all(&pool)
            .await?;
    for table in &tables {
        sqlx::query(&format!("ANALYZE {table}")).execute(&pool).await?;
    }
    println!("api: analyzed {} tables (as autovacuum would after a bulk load)", tables.len());
    Ok(())
}

/// Removes a benchmark namespace's tables, functions and keys from a server store (through
/// the store's own `uninstall`), so runs do not pile them up. A SQLite run's file goes with
/// the run's temporary directory. A failure is reported, not fatal: the figures are taken.
pub async fn cleanup(url: &str, prefix: &Prefix) {
    if url.starts_with("sqlite") {
        return;
    }
    let removed = match solocron_stores::open(url, prefix).await {
        Ok(store) => store.uninstall().await.map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::Error::from(e)),
    };
    if let Err(e) = removed {
        eprintln!("warning: the benchmark's namespace `{prefix}` was left in the store: {e:#}");
    }
}

/// Creates every one of `ks` under `keys` if absent: one `Txn` per [`ETCD_TXN_OPS_MAX`] keys
/// (all compares "absent", all puts), [`ETCD_TXNS_IN_FLIGHT`] at once.
#[cfg(feature = "etcd")]
async fn etcd_batch(c: &etcd_client::Client, keys: &str, ks: &[String]) -> anyhow::Result<()> {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    use futures_util::{StreamExt as _, TryStreamExt as _};
    // Built whole before any is sent: a stream borrowing `ks` and `keys` across its awaits
    // would not be `Send` for every lifetime (the benchmark runs it on another thread).
    let txns: Vec<_> = ks
        .chunks(ETCD_TXN_OPS_MAX)
        .map(|chunk| {
            let full: Vec<String> = chunk.iter().map(|k| format!("{keys}{k}")).collect();
            let when: Vec<Compare> =
                full.iter().map(|k| Compare::create_revision(k.as_str(), CompareOp::Equal, 0)).collect();
            let then: Vec<TxnOp> = full.iter().map(|k| TxnOp::put(k.as_str(), "1", Some(PutOptions::new()))).collect();
            let (mut kv, txn) = (c.kv_client(), Txn::new().when(when).and_then(then));
            async move { kv.txn(txn).await }
        })
        .collect();
    let done: Vec<_> = futures_util::stream::iter(txns).buffer_unordered(ETCD_TXNS_IN_FLIGHT).try_collect().await?;
    anyhow::ensure!(done.iter().all(|r| r.succeeded()), "a raw etcd batch found a key present (they are new)");
    Ok(())
}

/// `etcd://host:port,host:port` → the client's endpoints (the benchmark uses no credentials).
#[cfg(feature = "etcd")]
fn etcd_endpoints(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("etcd://").trim_end_matches('/');
    hosts.split(',').map(|h| format!("http://{h}")).collect()
}
