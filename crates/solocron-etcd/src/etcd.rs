//! Thin helpers over `etcd-client`: bounded calls (retried where that is safe), transactions,
//! range reads in pages, and the lease primitives (grant, keep-alive, revoke).

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, GetOptions, GetResponse, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use solocron_core::StoreError;

use crate::error::{etcd_err, never_sent, transient};

/// etcd's default `--max-txn-ops`: most compares, and most operations per branch, that one
/// `Txn` may carry. Every transaction of this crate stays within it.
pub const TXN_OPS_MAX: usize = 128;

/// How long one call to etcd may take before it counts as unreachable; below the engine's
/// 5 s store-call timeout so that a slow cluster surfaces as "unavailable" from here.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(4500);

/// The fleet's clock, in milliseconds since the epoch: this process's clock plus the
/// median offset of the fleet's clocks as last heard (`clock.rs`; zero until then). etcd
/// has no clock API: this is what every instant this store records, and
/// [`solocron_core::StoreBase::now`], read. Nothing that decides who holds a run depends on it.
pub(crate) fn now_ms() -> i64 {
    crate::clock::process_now_ms() + crate::clock::fleet_offset_ms()
}

/// How many more times a call that never reached a member is sent again. The client
/// balances calls over the endpoints, dead ones included: with one member of three down,
/// about a third of calls fail to connect, and each such call can safely go again (it was
/// never sent), likely to a live member. A refused connection fails at once, so many tries
/// cost little; with 4, one call in ~250 still failed with one member of three down.
const UNSENT_RETRIES: u32 = 16;

/// Runs one call to etcd within [`CALL_TIMEOUT`], sending it again (to any endpoint) while
/// it did not reach a member. `call` gets a client of its own for each try.
pub(crate) async fn bounded<T, F, Fut>(client: &Client, what: &str, call: F) -> Result<T, StoreError>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    bounded_as(client, what, false, call).await
}

/// Like [`bounded`], for a call that changes nothing (a read): it is also sent again after
/// any failure a retry may cure, such as the reset of a connection to a member that just
/// died (the next try goes to another endpoint), within the same bounds.
pub(crate) async fn bounded_read<T, F, Fut>(client: &Client, what: &str, call: F) -> Result<T, StoreError>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    bounded_as(client, what, true, call).await
}

async fn bounded_as<T, F, Fut>(client: &Client, what: &str, read_only: bool, mut call: F) -> Result<T, StoreError>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let tries = async {
        let mut retries = 0;
        loop {
            match call(client.clone()).await {
                Err(e) if retries < UNSENT_RETRIES && (never_sent(&e) || (read_only && transient(&e))) => retries += 1,
                result => return result,
            }
        }
    };
    match tokio::time::timeout(CALL_TIMEOUT, tries).await {
        Ok(result) => result.map_err(etcd_err),
        Err(_) => Err(StoreError::Unavailable(format!("etcd did not answer {what} within {CALL_TIMEOUT:?}"))),
    }
}

/// Runs one transaction.
pub(crate) async fn txn(client: &Client, what: &str, txn: Txn) -> Result<TxnResponse, StoreError> {
    bounded(client, what, |mut c| {
        let txn = txn.clone();
        async move { c.txn(txn).await }
    })
    .await
}

/// A range read.
pub(crate) async fn range(
    client: &Client,
    what: &str,
    start: &str,
    options: GetOptions,
) -> Result<GetResponse, StoreError> {
    bounded_read(client, what, |mut c| {
        let (start, options) = (start.to_owned(), options.clone());
        async move { c.get(start, Some(options)).await }
    })
    .await
}

/// Keys per page of a read of a whole family (every guard, every alive key, every
/// registration): under the client's 4 MB message limit even at 8 KB per value. A single
/// range of 100,000 guards (8.5 MB) was refused.
const FAMILY_PAGE: i64 = 500;
/// Most pages one family read takes (5,000,000 keys): a bound, far above any fleet.
const FAMILY_PAGES_MAX: usize = 10_000;

/// Every key-value in `[start, end)` (keys only if `keys_only`), read in pages of
/// [`FAMILY_PAGE`] at one revision: `revision`, or the first page's if 0. Returns them in
/// key order, with the revision they were read at.
pub(crate) async fn range_all(
    client: &Client,
    what: &str,
    range: (&str, &str),
    keys_only: bool,
    revision: i64,
) -> Result<(Vec<KeyValue>, i64), StoreError> {
    range_paged(client, what, range, keys_only, revision, FAMILY_PAGE).await
}

/// [`range_all`] in pages of `page` keys, for values too large for [`FAMILY_PAGE`] of them
/// to fit one message.
pub(crate) async fn range_paged(
    client: &Client,
    what: &str,
    (start, end): (&str, &str),
    keys_only: bool,
    revision: i64,
    page: i64,
) -> Result<(Vec<KeyValue>, i64), StoreError> {
    let (mut out, mut from, mut at) = (Vec::new(), start.to_owned(), revision);
    for _ in 0..FAMILY_PAGES_MAX {
        let mut options = GetOptions::new().with_range(end).with_limit(page).with_revision(at);
        if keys_only {
            options = options.with_keys_only();
        }
        let mut resp = range(client, what, &from, options).await?;
        if at == 0 {
            at = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| StoreError::Invalid("etcd answered without a header".into()))?;
        }
        let more = resp.more();
        let kvs = resp.take_kvs();
        let next = kvs.last().map(|kv| format!("{}\0", String::from_utf8_lossy(kv.key())));
        out.extend(kvs);
        match next {
            Some(next) if more => from = next,
            _ => return Ok((out, at)),
        }
    }
    Err(StoreError::Invalid(format!("{what}: more than {} keys", page as usize * FAMILY_PAGES_MAX)))
}

/// The revision at which a response was applied.
pub(crate) fn revision(resp: &TxnResponse) -> Result<i64, StoreError> {
    resp.header().map(|h| h.revision()).ok_or_else(|| StoreError::Invalid("etcd answered without a header".into()))
}

/// The key-values of each `Get` in a transaction's response, in operation order.
pub(crate) fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        })
        .collect()
}

/// A `Get` of one key.
pub(crate) fn get(key: impl Into<Vec<u8>>) -> TxnOp {
    TxnOp::get(key, None)
}

/// Reads several keys (or ranges) at one revision: one read-only transaction per
/// [`TXN_OPS_MAX`] operations (a single round trip for up to that many).
pub(crate) async fn read(client: &Client, ops: Vec<TxnOp>) -> Result<Vec<Vec<KeyValue>>, StoreError> {
    let mut out = Vec::with_capacity(ops.len());
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        let chunk: Vec<TxnOp> = ops.by_ref().take(TXN_OPS_MAX).collect();
        let request = Txn::new().and_then(chunk);
        let resp = bounded_read(client, "a read", |mut c| {
            let request = request.clone();
            async move { c.txn(request).await }
        })
        .await?;
        out.extend(gets(&resp));
    }
    Ok(out)
}

/// The single key-value of a `Get` of one key, if the key exists.
pub(crate) fn single(kvs: Vec<KeyValue>) -> Option<KeyValue> {
    kvs.into_iter().next()
}

/// Grants an etcd lease of `ttl` seconds; its id.
pub(crate) async fn grant(client: &Client, ttl: i64) -> Result<i64, StoreError> {
    Ok(bounded(client, "a lease grant", |mut c| async move { c.lease_grant(ttl, None).await }).await?.id())
}

/// Revokes leases this store granted and no longer needs, ignoring failures: a lease with
/// no key attached is harmless and expires by itself.
pub(crate) async fn revoke_quietly(client: &Client, ids: Vec<i64>) {
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let client = client.clone();
        tasks.spawn(async move {
            if let Err(e) = bounded(&client, "a lease revoke", |mut c| async move { c.lease_revoke(id).await }).await {
                tracing::debug!(lease = id, error = %e, "cannot revoke an unused etcd lease; it will expire");
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Sends one keep-alive for lease `id`: true if etcd refreshed it to its full TTL, false
/// if the lease no longer exists (expired, by etcd's judgement, or revoked).
pub(crate) async fn keep_alive(client: &Client, id: i64) -> Result<bool, StoreError> {
    bounded(client, "a keep-alive", |mut c| async move {
        match c.lease_keep_alive(id).await {
            // The stream is dropped at once: one request, one answer.
            Ok(_) => Ok(true),
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(e) => Err(e),
        }
    })
    .await
}
