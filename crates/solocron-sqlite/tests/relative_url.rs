//! Relative `sqlite:` URLs resolve against the current directory. In its own test binary
//! (its own process) because it changes the current directory.
#![forbid(unsafe_code)]

use solocron_core::Prefix;
use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use solocron_sqlite::SqliteStore;

#[tokio::test]
async fn relative_urls_open_files_under_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let cwd = std::env::current_dir().unwrap();

    let plain = SqliteStore::connect("sqlite:plain.db", &Prefix::default()).await.unwrap();
    let slashed = SqliteStore::connect("sqlite://sub/slashed.db", &Prefix::default()).await.unwrap();
    assert!(cwd.join("plain.db").exists() && cwd.join("sub/slashed.db").exists());
    assert_eq!(plain.describe(), format!("sqlite://{}", cwd.join("plain.db").display()));
    assert_eq!(slashed.describe(), format!("sqlite://{}", cwd.join("sub/slashed.db").display()));
    plain.migrate().await.unwrap();
}
