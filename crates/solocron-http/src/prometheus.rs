//! The process's metrics recorder: whatever is recorded through the
//! [`metrics`](https://docs.rs/metrics) facade (solocron's engine, and an embedding program's
//! own counters, gauges and histograms) is stored in prometheus-client's metric types and
//! rendered by its OpenMetrics text encoder for `/metrics`.
//!
//! **Structure.** The facade names a series by a [`Key`] (a name and label pairs) and asks
//! the recorder for it on every record, so the record path is a lookup. Two indexes hold
//! the same series:
//! - per kind, a map from the facade's `Key` to the series, split in shards by the key's
//!   hash (computed once, when the key is built): a record is one shared read lock on one
//!   shard, a lookup by that hash, and a reference count, with no allocation and no lock
//!   that writers hold but to insert a new series;
//! - per metric name, a family: its description (HELP, unit) and its series in the order
//!   they appeared, each with its label pairs (`Vec<(String, String)>`) made valid and
//!   escaped once, when it is created, so a scrape only writes them out.
//!
//! Both are filled lazily, the first time a series is recorded (or a name described): the
//! engine bounds how many series there are (`solocron::metrics` states the bound), so
//! nothing is ever removed. A scrape reads the families under a read lock and each series'
//! value atomically; recording into existing series never waits for a scrape.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use metrics::{CounterFn, GaugeFn, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{text, DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit as OmUnit};

/// Bucket bounds (seconds) of every histogram. A copy of
/// `solocron::metrics::HISTOGRAM_BUCKETS_SECONDS` (crates/solocron/src/metrics.rs), which
/// this crate cannot read: `solocron` depends on it. Keep the two equal.
pub const HISTOGRAM_BUCKETS_SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// What `/metrics` answers with: the OpenMetrics text format that prometheus-client writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Shards of each per-kind index: recording threads rarely share a lock's cache line.
const SHARDS: usize = 16;

/// Installs the process's metrics recorder (once; later calls return the same handle).
/// `None` when another recorder was installed first (an embedding service's own): then
/// solocron's metrics go to that recorder, and `/metrics` answers 404.
pub fn install_prometheus() -> Option<MetricsHandle> {
    static HANDLE: OnceLock<Option<MetricsHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let (recorder, handle) = recorder(HISTOGRAM_BUCKETS_SECONDS);
            match metrics::set_global_recorder(recorder) {
                Ok(()) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed; /metrics will answer 404");
                    None
                }
            }
        })
        .clone()
}

/// A recorder that stores into a new set of families, and the handle that renders them.
fn recorder(buckets: &[f64]) -> (PrometheusRecorder, MetricsHandle) {
    let store = Arc::new(Store::new(buckets));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StoreCollector(store.clone())));
    let handle = MetricsHandle { registry: Arc::new(registry), last_len: Arc::new(AtomicUsize::new(0)) };
    (PrometheusRecorder(store), handle)
}

/// Renders what the process's recorder holds ([`install_prometheus`]). Cheap to clone:
/// every clone renders the same metrics.
#[derive(Clone, Debug)]
pub struct MetricsHandle {
    registry: Arc<Registry>,
    /// The last rendering's length, to size the next one's buffer at once.
    last_len: Arc<AtomicUsize>,
}

impl MetricsHandle {
    /// Every metric recorded so far, in the OpenMetrics text format
    /// ([`OPENMETRICS_CONTENT_TYPE`]), ending with `# EOF`.
    pub fn render(&self) -> String {
        let last = self.last_len.load(Ordering::Relaxed);
        let mut out = String::with_capacity(last + last / 8);
        text::encode(&mut out, &self.registry).expect("writing to a String does not fail");
        self.last_len.store(out.len(), Ordering::Relaxed);
        out
    }
}

/// A gauge holding an `f64`, as the facade's gauges do.
type F64Gauge = Gauge<f64, AtomicU64>;

/// One series: its label pairs as they are written (names made valid, values escaped) and
/// its value.
#[derive(Debug)]
struct Series<M> {
    labels: Vec<(String, String)>,
    metric: M,
}

impl CounterFn for Series<Counter> {
    fn increment(&self, value: u64) {
        self.metric.inc_by(value);
    }
    fn absolute(&self, value: u64) {
        self.metric.inner().fetch_max(value, Ordering::Relaxed);
    }
}

impl GaugeFn for Series<F64Gauge> {
    fn increment(&self, value: f64) {
        self.metric.inc_by(value);
    }
    fn decrement(&self, value: f64) {
        self.metric.dec_by(value);
    }
    fn set(&self, value: f64) {
        self.metric.set(value);
    }
}

impl HistogramFn for Series<Histogram> {
    fn record(&self, value: f64) {
        self.metric.observe(value);
    }
}

/// Hashes a [`Key`] by the hash it computed when it was built (its `Hash` writes only
/// that), instead of hashing it again.
#[derive(Default)]
struct KeyHash(u64);

impl Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for a `Key`; kept correct for any other input.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
}

type Shard<M> = RwLock<HashMap<Key, Arc<Series<M>>, BuildHasherDefault<KeyHash>>>;

/// The series of one kind, by the facade's key.
#[derive(Debug)]
struct Index<M> {
    shards: Vec<Shard<M>>,
}

impl<M: Kind> Index<M> {
    fn new() -> Index<M> {
        Index { shards: (0..SHARDS).map(|_| RwLock::default()).collect() }
    }

    /// The series of `key`, created (with `make`, and added to its family) if new.
    fn series(&self, key: &Key, families: &Families, make: impl FnOnce() -> M) -> Arc<Series<M>> {
        // The high bits pick the shard: the map inside uses the low ones.
        let shard = &self.shards[(key.get_hash() >> 60) as usize % SHARDS];
        if let Some(series) = read(shard).get(key) {
            return series.clone();
        }
        let series = match write(shard).entry(key.clone()) {
            Entry::Occupied(e) => return e.get().clone(),
            Entry::Vacant(e) => e.insert(Arc::new(Series { labels: label_pairs(key), metric: make() })).clone(),
        };
        // Outside the shard's lock: a scrape holding the families delays only new series.
        families.add(key.name(), series.clone());
        series
    }
}

/// A metric type the recorder stores: how its series sit in a family.
trait Kind: Sized + EncodeMetric {
    /// A family's members holding `series` only.
    fn members(series: Arc<Series<Self>>) -> Members;
    /// The series of `members` if they are of this kind.
    fn list(members: &mut Members) -> Option<&mut Vec<Arc<Series<Self>>>>;
}

impl Kind for Counter {
    fn members(series: Arc<Series<Self>>) -> Members {
        Members::Counters(vec![series])
    }
    fn list(members: &mut Members) -> Option<&mut Vec<Arc<Series<Self>>>> {
        match members {
            Members::Counters(list) => Some(list),
            _ => None,
        }
    }
}

impl Kind for F64Gauge {
    fn members(series: Arc<Series<Self>>) -> Members {
        Members::Gauges(vec![series])
    }
    fn list(members: &mut Members) -> Option<&mut Vec<Arc<Series<Self>>>> {
        match members {
            Members::Gauges(list) => Some(list),
            _ => None,
        }
    }
}

impl Kind for Histogram {
    fn members(series: Arc<Series<Self>>) -> Members {
        Members::Histograms(vec![series])
    }
    fn list(members: &mut Members) -> Option<&mut Vec<Arc<Series<Self>>>> {
        match members {
            Members::Histograms(list) => Some(list),
            _ => None,
        }
    }
}

/// A family's series, all of one kind.
#[derive(Debug)]
enum Members {
    Counters(Vec<Arc<Series<Counter>>>),
    Gauges(Vec<Arc<Series<F64Gauge>>>),
    Histograms(Vec<Arc<Series<Histogram>>>),
}

impl Members {
    fn metric_type(&self) -> MetricType {
        match self {
            Members::Counters(_) => MetricType::Counter,
            Members::Gauges(_) => MetricType::Gauge,
            Members::Histograms(_) => MetricType::Histogram,
        }
    }

    fn encode(&self, encoder: MetricEncoder) -> fmt::Result {
        match self {
            Members::Counters(list) => encode_series(list, encoder),
            Members::Gauges(list) => encode_series(list, encoder),
            Members::Histograms(list) => encode_series(list, encoder),
        }
    }
}

/// Writes a family's series; a lone series without labels is written without braces.
fn encode_series<M: EncodeMetric>(list: &[Arc<Series<M>>], mut encoder: MetricEncoder) -> fmt::Result {
    if let [only] = list {
        if only.labels.is_empty() {
            return only.metric.encode(encoder);
        }
    }
    for series in list {
        series.metric.encode(encoder.encode_family(&series.labels)?)?;
    }
    Ok(())
}

/// One metric name: its description, and its series once one is recorded.
#[derive(Debug, Default)]
struct Family {
    /// The description, escaped; written as is (prometheus-client's `Registry::register`
    /// would append a period, doubling the one descriptions end with).
    help: String,
    unit: Option<Unit>,
    members: Option<Members>,
}

/// The families by the facade's metric name, in the order they are written.
#[derive(Debug, Default)]
struct Families(RwLock<BTreeMap<String, Family>>);

impl Families {
    fn describe(&self, name: &str, unit: Option<Unit>, description: &str) {
        let mut families = write(&self.0);
        let family = families.entry(name.to_owned()).or_default();
        family.help = escape(description);
        family.unit = unit;
    }

    fn add<M: Kind>(&self, name: &str, series: Arc<Series<M>>) {
        let mut families = write(&self.0);
        let family = families.entry(name.to_owned()).or_default();
        match &mut family.members {
            None => family.members = Some(M::members(series)),
            Some(members) => match M::list(members) {
                Some(list) => list.push(series),
                None => tracing::warn!(
                    metric = name,
                    "a metric is recorded as two kinds (counter, gauge, histogram); only the first is exported"
                ),
            },
        }
    }
}

/// Everything recorded: the series by key, and the families they are written from.
#[derive(Debug)]
struct Store {
    counters: Index<Counter>,
    gauges: Index<F64Gauge>,
    histograms: Index<Histogram>,
    families: Families,
    buckets: Vec<f64>,
}

impl Store {
    fn new(buckets: &[f64]) -> Store {
        Store {
            counters: Index::new(),
            gauges: Index::new(),
            histograms: Index::new(),
            families: Families::default(),
            buckets: buckets.to_vec(),
        }
    }
}

/// The facade's recorder over a [`Store`].
struct PrometheusRecorder(Arc<Store>);

impl Recorder for PrometheusRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.families.describe(key.as_str(), unit, &description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.families.describe(key.as_str(), unit, &description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.families.describe(key.as_str(), unit, &description);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.0.counters.series(key, &self.0.families, Counter::default))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.0.gauges.series(key, &self.0.families, F64Gauge::default))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        let make = || Histogram::new(self.0.buckets.iter().copied());
        metrics::Histogram::from_arc(self.0.histograms.series(key, &self.0.families, make))
    }
}

/// Writes a [`Store`]'s families when the registry is encoded.
#[derive(Debug)]
struct StoreCollector(Arc<Store>);

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let families = read(&self.0.families.0);
        for (name, family) in families.iter() {
            let Some(members) = &family.members else { continue };
            let (name, unit) = family_name(name, members.metric_type(), family.unit);
            let metric = encoder.encode_descriptor(&name, &family.help, unit.as_ref(), members.metric_type())?;
            members.encode(metric)?;
        }
        Ok(())
    }
}

/// The family name and unit to write for the facade's metric `name`. prometheus-client
/// appends `_total` to a counter's samples and the unit to the family's name, so they are
/// taken off here: a name keeps its samples' spelling. A unit that `name` does not end
/// with is left out rather than appended (OpenMetrics wants it as the name's suffix).
fn family_name(name: &str, kind: MetricType, unit: Option<Unit>) -> (String, Option<OmUnit>) {
    let name = valid_name(name, true);
    let base = match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(&name),
        _ => &name,
    };
    if let Some(unit) = unit.and_then(openmetrics_unit) {
        if let Some(stem) = base.strip_suffix(unit.as_str()).and_then(|s| s.strip_suffix('_')) {
            return (stem.to_owned(), Some(unit));
        }
    }
    (base.to_owned(), None)
}

/// The OpenMetrics unit of a facade unit; none for a count (no dimension, and `_count` is a
/// histogram's own suffix).
fn openmetrics_unit(unit: Unit) -> Option<OmUnit> {
    match unit {
        Unit::Count => None,
        Unit::Seconds => Some(OmUnit::Seconds),
        Unit::Bytes => Some(OmUnit::Bytes),
        other => Some(OmUnit::Other(other.as_str().to_owned())),
    }
}

/// A key's label pairs as they are written.
fn label_pairs(key: &Key) -> Vec<(String, String)> {
    key.labels().map(|l| (valid_name(l.key(), false), escape(l.value()))).collect()
}

/// `name` with every character a metric name (`colons`) or label name may not hold
/// replaced by `_`, and `_` before a leading digit.
fn valid_name(name: &str, colons: bool) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    out.extend(name.chars().map(|c| if allowed(c) { c } else { '_' }));
    out
}

/// `text` escaped for a label value or HELP text: backslash, double quote, line feed.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Locks for reading; a panic elsewhere leaves the maps whole (every change is one insert).
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

    use super::*;

    /// Renders what `record` records through the facade into a recorder of its own.
    fn rendered(record: impl FnOnce()) -> String {
        let (recorder, handle) = recorder(HISTOGRAM_BUCKETS_SECONDS);
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    #[test]
    fn counters_gauges_and_histograms_are_written_with_labels_help_and_units() {
        let text = rendered(|| {
            describe_counter!("app_ticks_total", Unit::Count, "Ticks, by job and outcome.");
            describe_gauge!("app_last_success_timestamp_seconds", Unit::Seconds, "Last success.");
            describe_histogram!("app_lateness_seconds", Unit::Seconds, "How late a run started.");
            counter!("app_ticks_total", "job" => "backup", "outcome" => "succeeded").increment(2);
            counter!("app_ticks_total", "job" => "backup", "outcome" => "failed").increment(1);
            gauge!("app_last_success_timestamp_seconds", "job" => "backup").set(1_700_000_000.5);
            histogram!("app_lateness_seconds").record(0.003);
            histogram!("app_lateness_seconds").record(20.0);
        });
        for line in [
            "# HELP app_ticks Ticks, by job and outcome.\n# TYPE app_ticks counter\n",
            "app_ticks_total{job=\"backup\",outcome=\"succeeded\"} 2\n",
            "app_ticks_total{job=\"backup\",outcome=\"failed\"} 1\n",
            "# HELP app_last_success_timestamp_seconds Last success.\n",
            "# TYPE app_last_success_timestamp_seconds gauge\n# UNIT app_last_success_timestamp_seconds seconds\n",
            "app_last_success_timestamp_seconds{job=\"backup\"} 1700000000.5\n",
            "# HELP app_lateness_seconds How late a run started.\n# TYPE app_lateness_seconds histogram\n",
            "app_lateness_seconds_sum 20.003\napp_lateness_seconds_count 2\n",
            "app_lateness_seconds_bucket{le=\"0.001\"} 0\n",
            "app_lateness_seconds_bucket{le=\"0.005\"} 1\n",
            "app_lateness_seconds_bucket{le=\"10.0\"} 1\n",
            "app_lateness_seconds_bucket{le=\"+Inf\"} 2\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(!text.contains(".."), "a doubled period:\n{text}");
    }

    #[test]
    fn a_metric_without_description_or_suffixes_keeps_its_name() {
        let text = rendered(|| {
            counter!("requests").increment(3);
            gauge!("queue_depth_seconds").set(1.0);
            gauge!("in_flight").increment(2.0);
            gauge!("in_flight").decrement(0.5);
        });
        assert!(text.contains("# TYPE requests counter\nrequests_total 3\n"), "{text}");
        assert!(text.contains("# TYPE queue_depth_seconds gauge\nqueue_depth_seconds 1.0\n"), "{text}");
        assert!(text.contains("in_flight 1.5\n"), "{text}");
    }

    #[test]
    fn names_are_made_valid_and_label_values_escaped() {
        let text = rendered(|| {
            counter!("http.requests-total", "2nd key" => "a \"quoted\"\\ value\nnext").increment(1);
        });
        let line = "http_requests_total{_2nd_key=\"a \\\"quoted\\\"\\\\ value\\nnext\"} 1\n";
        assert!(text.contains(line), "{text}");
    }

    #[test]
    fn a_description_after_the_first_record_still_applies() {
        let text = rendered(|| {
            counter!("late_total", "k" => "v").absolute(5);
            counter!("late_total", "k" => "v").absolute(4);
            describe_counter!("late_total", "Described late.");
        });
        assert!(text.contains("# HELP late Described late.\n# TYPE late counter\nlate_total{k=\"v\"} 5\n"), "{text}");
    }

    #[test]
    fn a_name_recorded_as_a_second_kind_is_not_exported_twice() {
        let text = rendered(|| {
            counter!("mixed").increment(1);
            gauge!("mixed").set(7.0);
        });
        assert_eq!(text.matches("# TYPE mixed").count(), 1, "{text}");
        assert!(text.contains("mixed_total 1\n"), "{text}");
    }

    #[test]
    fn the_same_series_is_one_series_however_often_it_is_looked_up() {
        let (recorder, handle) = recorder(HISTOGRAM_BUCKETS_SECONDS);
        metrics::with_local_recorder(&recorder, || {
            for i in 0..1000 {
                counter!("many_total", "job" => format!("job-{}", i % 10)).increment(1);
            }
        });
        let text = handle.render();
        assert_eq!(text.lines().filter(|l| l.starts_with("many_total{")).count(), 10, "{text}");
        assert!(text.contains("many_total{job=\"job-3\"} 100\n"), "{text}");
    }
}
