//! # solocron-conformance
//!
//! One set of checks, written once against the [`Store`] trait, that every store must pass
//! unchanged: claim uniqueness under concurrency, batch claims, fencing, leases judged by
//! the store's clock, recovery, overlap, misfire bookkeeping, history and pruning, the job
//! registry, pause, manual runs and unlock, node heartbeats and the audit log.
//!
//! A server store crate runs the whole suite with one line in `tests/conformance.rs`:
//!
//! ```ignore
//! solocron_conformance::conformance_tests!(common::Namespace::new());
//! ```
//!
//! where the expression is a future yielding `Option<impl StoreFactory>`: `None` means the
//! server is unreachable and the tests skip (see [`server_unreachable`]). [`server`] holds
//! the test namespaces every server store's tests share (fresh prefixes, cleanup, skip or
//! fail); a store only says how to reach its server. Each check is also a plain
//! `pub async fn` in [`checks`], to call one by hand while debugging a store.
//!
//! Architecture invariant: this crate knows no concrete store (stores dev-depend on it).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::sync::Arc;

use async_trait::async_trait;
use solocron_core::Store;

/// Opens stores onto one isolated namespace (a fresh SQLite file, a fresh table prefix, a
/// fresh key prefix). Each test gets its own factory, so checks may use fixed job names.
///
/// The namespace must be empty until the first store migrates it: the factory creates
/// nothing itself, so that [`checks::migrate_is_safe_when_many_nodes_start_at_once`] can
/// race migrations onto a truly empty namespace.
///
/// ```ignore
/// struct Factory { url: String, prefix: Prefix } // a fresh SQLite file's URL
///
/// #[async_trait::async_trait]
/// impl solocron_conformance::StoreFactory for Factory {
///     async fn connect(&self) -> Arc<dyn Store> {
///         Arc::new(SqliteStore::connect(&self.url, &self.prefix).await.unwrap())
///     }
/// }
/// ```
///
/// Server stores need not write one: [`server::Namespace`] is their factory.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// A new, independent store instance (its own connection pool, as a separate process
    /// would have) onto this factory's namespace, NOT migrated. Panics if it cannot connect.
    async fn connect(&self) -> Arc<dyn Store>;

    /// The coarsest lease length the store can express and expire on time (etcd: whole
    /// seconds, at least 2 s, seen expired up to 0.5 s late). The checks scale their short
    /// leases and their waits past them by it; the assertions stay the same. Default: zero
    /// (millisecond leases, expired when the store's clock says so).
    fn lease_resolution(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Whether the store has a clock of its own that judges claims (every store but etcd,
    /// whose "now" is the client's): only such a store refuses a tick claimed too early
    /// ([`solocron_core::ClaimOutcome::TooEarly`]). Default: true.
    fn has_clock(&self) -> bool {
        true
    }

    /// A factory onto another namespace beside this one (another prefix in the same file or
    /// on the same server), empty like this one, for the checks that one prefix never sees
    /// another's data. Default: `None`, and those checks skip that part.
    fn neighbour(&self) -> Option<Box<dyn StoreFactory>> {
        None
    }

    /// A new, independent store instance like [`connect`](Self::connect), migrated.
    async fn open(&self) -> Arc<dyn Store> {
        let store = self.connect().await;
        if let Err(e) = store.migrate().await {
            panic!("cannot migrate {}: {e}", store.describe());
        }
        store
    }
}

/// Names of test namespaces (table or key prefixes) that cleanup can date, so a test run
/// can remove what killed runs left behind without touching a run still in progress.
pub mod naming {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    /// Namespaces younger than this are left alone: another `cargo test` may be using them.
    pub const STALE_AFTER: Duration = Duration::from_secs(600);

    /// The length of a [`fresh_tag`], in characters.
    pub const TAG_LEN: usize = 16;

    fn unix_secs() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
    }

    /// 16 hex digits: the creation second (8), then 8 random ones. Unique per call.
    ///
    /// ```
    /// let tag = solocron_conformance::naming::fresh_tag();
    /// assert_eq!(tag.len(), solocron_conformance::naming::TAG_LEN);
    /// assert!(!solocron_conformance::naming::is_stale(&tag));
    /// ```
    pub fn fresh_tag() -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u32(std::process::id());
        hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos());
        format!("{:08x}{:08x}", unix_secs() as u32, hasher.finish() as u32)
    }

    /// Whether `tag` (text starting with a [`fresh_tag`]) was made more than
    /// [`STALE_AFTER`] ago; false for text that is not a tag.
    pub fn is_stale(tag: &str) -> bool {
        let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
        tag.get(..8).and_then(|h| u64::from_str_radix(h, 16).ok()).is_some_and(|created| created < cutoff)
    }
}

/// Decides what to do when a server store cannot be reached: under CI (`CI` set) the run
/// fails; elsewhere the test prints why it skips and returns `None`.
pub fn server_unreachable<T>(store: &str, why: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("{store} is unreachable under CI: {why}");
    }
    eprintln!("skipping: {store} is unreachable ({why}); set CI=1 to make this a failure");
    None
}

/// Expands to one `#[tokio::test]` per conformance check, each with a fresh namespace from
/// `$factory` (an expression yielding a future of `Option<impl StoreFactory>`). The calling
/// crate needs `tokio` (with `macros` and `rt-multi-thread`) among its (dev-)dependencies.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!($factory;
            // Claims.
            exactly_one_of_many_concurrent_claimers_wins_each_tick,
            a_batch_claim_answers_each_request_in_request_order,
            fencing_tokens_strictly_increase_per_job_across_claims_and_recoveries,
            a_skip_claim_records_the_tick_skipped_with_its_reason_only_if_absent,
            overlap_skips_while_any_run_of_the_job_is_running_even_expired,
            a_batch_claim_checks_overlap_against_runs_from_before_and_from_the_batch,
            a_batch_of_distinct_jobs_answers_every_kind_of_request_as_one_claim_would,
            a_claim_asked_again_with_its_nonce_is_won_again_only_while_its_run_is_untouched,
            a_scheduled_claim_too_far_ahead_of_the_store_clock_is_refused_and_writes_nothing,
            taken_ticks_answers_exactly_the_ticks_a_claim_would_find_taken,
            // Leases and ends.
            only_the_owner_with_its_token_renews_and_only_before_expiry,
            leases_are_judged_by_the_store_clock_not_the_nodes,
            expired_lists_oldest_lease_first_up_to_the_limit,
            the_owner_finishes_once_with_its_end_output_tail_and_start,
            an_end_with_a_nul_byte_in_its_output_is_recorded,
            a_batch_of_ends_records_each_as_finish_would,
            a_batch_of_ends_racing_claims_of_the_same_jobs_leaves_only_live_runs_running,
            a_batch_of_renewals_extends_each_lease_as_renew_would,
            a_lapsed_run_nobody_recovered_still_records_its_end,
            // Recovery.
            exactly_one_of_many_recoverers_abandons_an_expired_run_only_after_expiry,
            exactly_one_of_many_recoverers_retries_an_expired_run_only_after_expiry,
            // Failure retries.
            a_failed_run_finished_for_retry_waits_its_backoff_then_exactly_one_node_starts_it,
            a_due_retry_can_be_dropped_once_and_a_run_ended_elsewhere_gets_no_retry,
            // History.
            history_filters_orders_newest_first_and_limits,
            prune_deletes_only_old_ended_records_in_batches_and_old_requests,
            // Registry and operators' controls.
            register_records_a_nodes_whole_list_keeping_first_seen_and_removing_unlisted_jobs,
            a_page_of_registrations_and_the_registered_names_agree_with_the_whole_registry,
            a_registry_read_in_pages_returns_every_registration_present_throughout,
            a_paused_job_records_its_scheduled_ticks_skipped_but_runs_manual_ones,
            manual_requests_get_unique_off_second_ticks_and_stay_pending_until_claimed,
            a_request_made_elsewhere_wakes_the_request_watch,
            unlock_abandons_the_jobs_running_runs_and_fences_out_their_holders,
            // Nodes and the audit log.
            a_heartbeat_lists_the_node_by_store_clock_until_its_goodbye_and_a_later_beat_restarts_it,
            every_action_is_recorded_with_who_why_and_what_newest_first_and_by_job,
            nodes_and_actions_of_another_prefix_are_not_seen,
            prune_forgets_old_actions_and_long_silent_nodes,
            // Managed jobs.
            managed_jobs_are_written_only_at_the_expected_revision_and_every_change_is_a_revision,
            racing_writers_get_one_winner_per_revision_and_distinct_revisions,
            a_managed_job_change_wakes_the_watch_and_stays_in_its_prefix,
            // Namespaces.
            expired_lists_only_the_runs_of_the_namespaces_asked,
            pending_requests_lists_only_the_requests_of_the_namespaces_asked,
            prune_deletes_only_the_records_and_requests_of_the_namespaces_asked,
            history_keeps_to_the_namespace_asked,
            // Schema.
            migrate_is_safe_when_many_nodes_start_at_once,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let Some(factory) = $factory.await else { return };
                $crate::checks::$check(&factory).await;
            }
        )*
    };
}

pub mod checks;
pub mod proxy;
pub mod server;
