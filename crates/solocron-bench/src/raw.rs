//! The store's raw minimal operation, for the claim-overhead comparison, and cleanup.

use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{MySqlPool, PgPool, SqlitePool};

/// A direct connection doing the store's cheapest "insert if absent".
///
/// Its pools are set up like the stores' own: in particular, no ping before each use
/// (`test_before_acquire(false)`, as every SQL store of solocron sets), or every raw
/// insert would pay one more round trip than the claim it is compared with.
pub enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool, String),
    MySql(MySqlPool, String),
    Redis(redis::aio::ConnectionManager, String),
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::Client>, String),
}

impl Raw {
    pub async fn connect(url: &str, prefix: &str) -> anyhow::Result<Raw> {
        let raw = if url.starts_with("sqlite") {
            // The store's own settings (WAL, `synchronous = NORMAL`: no fsync per commit), so
            // that the comparison is of the operations, not of the durability settings.
            let options = url
                .parse::<SqliteConnectOptions>()?
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(std::time::Duration::from_secs(5));
            let pool = SqlitePoolOptions::new().test_before_acquire(false).connect_with(options).await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_raw (k TEXT PRIMARY KEY)").execute(&pool).await?;
            Raw::Sqlite(pool)
        } else if url.starts_with("postgres") {
            let pool = PgPoolOptions::new().test_before_acquire(false).connect(url).await?;
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {prefix}raw (k TEXT PRIMARY KEY)")).execute(&pool).await?;
            Raw::Postgres(pool, prefix.to_owned())
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            let pool = MySqlPoolOptions::new()
                .test_before_acquire(false)
                .connect(&url.replacen("mariadb://", "mysql://", 1))
                .await?;
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {prefix}raw (k VARCHAR(64) PRIMARY KEY)"))
                .execute(&pool)
                .await?;
            Raw::MySql(pool, prefix.to_owned())
        } else if url.starts_with("redis") {
            let client = redis::Client::open(url)?;
            Raw::Redis(redis::aio::ConnectionManager::new(client).await?, prefix.to_owned())
        } else if url.starts_with("etcd") {
            #[cfg(feature = "etcd")]
            {
                Raw::Etcd(Box::new(etcd_client::Client::connect(etcd_endpoints(url), None).await?), prefix.to_owned())
            }
            #[cfg(not(feature = "etcd"))]
            anyhow::bail!("this build has no etcd: build the benchmark with `--features etcd`")
        } else {
            anyhow::bail!("no raw operation for {url}")
        };
        Ok(raw)
    }

    /// One insert-if-absent of `k`: SQLite `INSERT OR IGNORE`, PostgreSQL `INSERT … ON
    /// CONFLICT DO NOTHING RETURNING`, MySQL `INSERT IGNORE`, Redis `SET k v NX PX`, etcd one
    /// `Txn` (create revision 0 → put).
    pub async fn insert(&self, k: &str) -> anyhow::Result<()> {
        match self {
            Raw::Sqlite(p) => {
                sqlx::query("INSERT OR IGNORE INTO bench_raw (k) VALUES (?)").bind(k).execute(p).await?;
            }
            Raw::Postgres(p, pre) => {
                sqlx::query(&format!("INSERT INTO {pre}raw (k) VALUES ($1) ON CONFLICT DO NOTHING RETURNING k"))
                    .bind(k)
                    .fetch_optional(p)
                    .await?;
            }
            Raw::MySql(p, pre) => {
                sqlx::query(&format!("INSERT IGNORE INTO {pre}raw (k) VALUES (?)")).bind(k).execute(p).await?;
            }
            Raw::Redis(c, pre) => {
                let mut c = c.clone();
                let _: Option<String> = redis::cmd("SET")
                    .arg(format!("{pre}raw:{k}"))
                    .arg("1")
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000)
                    .query_async(&mut c)
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Raw::Etcd(c, pre) => {
                use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
                let key = format!("{pre}raw/{k}");
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), "1", Some(PutOptions::new()))]);
                c.kv_client().txn(txn).await?;
            }
        }
        Ok(())
    }
}

/// For each `(list, drop)` of `kinds`: lists the names matching `like` with the `list`
/// query and runs the `drop` template (`{}` = the name) for each, ignoring failures. A macro,
/// since PostgreSQL's and MySQL's pools are different types.
macro_rules! drop_listed {
    ($pool:expr, $like:expr, $kinds:expr) => {
        for (list, drop) in $kinds {
            let names: Vec<(String,)> = sqlx::query_as(list).bind($like).fetch_all($pool).await.unwrap_or_default();
            for (name,) in names {
                let _ = sqlx::query(&drop.replace("{}", &name)).execute($pool).await;
            }
        }
    };
}

/// Drops a benchmark namespace's tables and functions (server stores), so runs do not pile
/// them up.
pub async fn cleanup(url: &str, prefix: &str) {
    let like = format!("{}%", prefix.replace('_', "\\_"));
    if url.starts_with("postgres") {
        let Ok(pool) = PgPool::connect(url).await else { return };
        // What to list (names matching `like`), and how to drop each.
        let kinds = [
            (
                "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1",
                "DROP TABLE IF EXISTS \"{}\" CASCADE",
            ),
            (
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema() AND p.proname LIKE $1",
                "DROP FUNCTION IF EXISTS {} CASCADE",
            ),
        ];
        drop_listed!(&pool, &like, kinds);
    } else if url.starts_with("redis") {
        let script =
            format!("redis-cli -h 127.0.0.1 --scan --pattern '{prefix}*' | xargs -r redis-cli -h 127.0.0.1 unlink");
        let _ = std::process::Command::new("sh").args(["-c", &script]).output();
    } else if url.starts_with("etcd") {
        #[cfg(feature = "etcd")]
        if let Ok(mut c) = etcd_client::Client::connect(etcd_endpoints(url), None).await {
            let _ = c.delete(prefix, Some(etcd_client::DeleteOptions::new().with_prefix())).await;
        }
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        let Ok(pool) = MySqlPool::connect(&url.replacen("mariadb://", "mysql://", 1)).await else { return };
        let kinds = [
            (
                "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?",
                "DROP TABLE IF EXISTS `{}`",
            ),
            (
                "SELECT CAST(routine_name AS CHAR) FROM information_schema.routines WHERE routine_schema = DATABASE() AND routine_name LIKE ?",
                "DROP PROCEDURE IF EXISTS `{}`",
            ),
        ];
        drop_listed!(&pool, &like, kinds);
    }
}

/// `etcd://host:port,host:port` → the client's endpoints (the benchmark uses no credentials).
#[cfg(feature = "etcd")]
fn etcd_endpoints(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("etcd://").trim_end_matches('/');
    hosts.split(',').map(|h| format!("http://{h}")).collect()
}
