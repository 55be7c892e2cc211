//! The configuration's rules, each through `Config::parse` as a user meets it: what is
//! accepted, and the error (file, key, words) for what is not.

use std::path::Path;
use std::time::Duration;

use solocron_core::{Misfire, OnCrash, Prefix};

use super::resolve::{rebase_sqlite, DEFAULT_STORE_URL};
use super::*;

const GOOD: &str = r#"
[store]
url = "sqlite://x.db"
[node]
id = "web-1"
[defaults]
timezone = "Europe/Berlin"
lease = "10s"
[[jobs]]
name = "a"
schedule = "*/5 * * * * *"
command = ["/bin/true"]
[[jobs]]
name = "b"
schedule = "0 0 1 * * *"
timezone = "Asia/Shanghai"
command = ["/bin/true"]
lease = "3s"
on_crash = "retry"
max_attempts = 5
misfire = "all"
catchup = "1h"
"#;

fn error_of(toml: &str) -> String {
    Config::parse("test.toml", toml).unwrap_err().to_string()
}

#[test]
fn defaults_apply_and_jobs_override_them() {
    let c = Config::parse("test.toml", GOOD).unwrap();
    assert_eq!(c.store.url, "sqlite://x.db");
    assert_eq!(c.store.prefix, Prefix::default());
    assert_eq!(c.history_retention, Some(Duration::from_secs(30 * 86_400)));
    assert_eq!(c.jobs[0].schedule.zone().name(), "Europe/Berlin");
    assert_eq!(c.jobs[0].policy.lease, Duration::from_secs(10));
    assert_eq!(c.jobs[1].schedule.zone().name(), "Asia/Shanghai");
    assert_eq!(c.jobs[1].policy.lease, Duration::from_secs(3));
    assert_eq!(c.jobs[1].policy.on_crash, OnCrash::Retry);
    assert_eq!(c.jobs[1].policy.misfire, Misfire::All);
    assert_eq!(c.jobs[1].policy.catchup, Duration::from_secs(3600));
}

#[test]
fn missing_store_means_the_sqlite_default() {
    let c = Config::parse("t.toml", "").unwrap();
    assert_eq!(c.store.url, DEFAULT_STORE_URL);
}

#[test]
fn a_retry_table_takes_defaults_for_what_it_leaves_out_and_defaults_apply_it_to_every_job() {
    let c = Config::parse("t.toml", &GOOD.replace("max_attempts = 5", "retry = { attempts = 4, backoff = \"20m\" }"))
        .unwrap();
    let b = c.jobs[1].policy.retry.expect("b retries");
    assert_eq!(
        (b.attempts, b.backoff, b.max_backoff, b.jitter),
        (4, Duration::from_secs(1200), Duration::from_secs(1200), true)
    );
    assert_eq!(c.jobs[0].policy.retry, None, "no retry unless asked");
    let c = Config::parse("t.toml", &GOOD.replace("[defaults]", "[defaults]\nretry = {}")).unwrap();
    let a = c.jobs[0].policy.retry.expect("a retries by the defaults");
    assert_eq!((a.attempts, a.backoff, a.max_backoff), (3, Duration::from_secs(10), Duration::from_secs(300)));
}

#[test]
fn each_bad_input_names_file_and_key() {
    let cases = [
        (GOOD.replace("lease = \"3s\"", "lease = \"3 parsecs\""), "jobs[1] (b).lease"),
        (GOOD.replace("*/5 * * * * *", "*/5 * 25 * * *"), "the hour field `25`"),
        (GOOD.replace("Asia/Shanghai", "Asia/Atlantis"), "jobs[1] (b).timezone"),
        (GOOD.replace("name = \"b\"", "name = \"a\""), "already used by jobs[0]"),
        (GOOD.replace("on_crash = \"retry\"", "on_crash = \"pray\""), "jobs[1] (b).on_crash"),
        (GOOD.replace("max_attempts = 5", "max_attempts = 0"), "jobs[1] (b).max_attempts"),
        (GOOD.replace("max_attempts = 5", "retry = { attempts = 1 }"), "jobs[1] (b).retry.attempts: must be between 2"),
        (GOOD.replace("max_attempts = 5", "retry = { backoff = \"soon\" }"), "jobs[1] (b).retry.backoff"),
        (
            GOOD.replace("max_attempts = 5", "retry = { backoff = \"1m\", max_backoff = \"30s\" }"),
            "jobs[1] (b).retry.max_backoff: must be at least `retry.backoff`",
        ),
        (GOOD.replace("max_attempts = 5", "retry = { tries = 3 }"), "tries"),
        (GOOD.replace("[node]", "[node]\ncolour = \"red\""), "node.colour: unknown key (line 5)"),
        (GOOD.replace("command = [\"/bin/true\"]\nlease", "command = []\nlease"), "jobs[1] (b).command"),
        (GOOD.replace("[defaults]", "[defaults]\nschedule = \"* * * * *\""), "defaults.schedule"),
        (GOOD.replace("[node]", "[node]\nhistory_retention = \"1h\""), "node.history_retention: 1h 00m is too short"),
        (
            GOOD.replace("[node]", "[node]\nhistory_retention = \"40d\"")
                .replace("catchup = \"1h\"", "catchup = \"30d\""),
            "node.history_retention",
        ),
        (
            GOOD.replace("url = \"sqlite://x.db\"", "url = \"sqlite://x.db\"\nprefix = \"Bad-Prefix\""),
            "store.prefix: bad prefix `Bad-Prefix`",
        ),
    ];
    for (toml, want) in cases {
        let e = error_of(&toml);
        assert!(e.starts_with("test.toml: "), "{e}");
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
}

#[test]
fn a_value_of_the_wrong_type_names_its_key_and_the_type_expected() {
    let e = error_of(&GOOD.replace("command = [\"/bin/true\"]\nlease", "command = \"echo hi\"\nlease"));
    assert!(
        e.starts_with("test.toml: jobs[1] (b).command: must be an array, not a string \"echo hi\" (line 17)"),
        "{e}"
    );
    assert!(e.contains("e.g. command = [\"/bin/sh\", \"-c\", \"echo hi\"]"), "{e}");
    let e = error_of(&GOOD.replace("max_attempts = 5", "max_attempts = \"5\""));
    assert!(e.starts_with("test.toml: jobs[1] (b).max_attempts: must be a whole number"), "{e}");
    let e = error_of(&GOOD.replace("[node]", "[node]\nmax_concurrent_runs = true"));
    assert!(e.starts_with("test.toml: node.max_concurrent_runs: must be a whole number"), "{e}");
    let e = error_of("[store]\nmigrate = \"yes\"\n");
    assert_eq!(e, "test.toml: store.migrate: must be true or false, without quotes, not a string \"yes\" (line 2)");
}

#[test]
fn a_job_is_named_in_its_namespace_which_the_node_must_serve() {
    let served = GOOD.replace("[node]", "[node]\nnamespaces = [\"billing\", \"default\"]");
    let with = |job_b: &str| served.replace("name = \"b\"", job_b);
    let full = |toml: &str| Config::parse("test.toml", toml).unwrap().jobs[1].name.clone();
    assert_eq!(full(&with("name = \"b\"\nnamespace = \"billing\"")), "billing/b");
    assert_eq!(full(&with("name = \"billing/b\"")), "billing/b", "the same job, by its full name");
    assert_eq!(full(&with("name = \"x/y\"\nnamespace = \"billing\"")), "billing/x/y");
    assert_eq!(full(&served.replace("[defaults]", "[defaults]\nnamespace = \"billing\"")), "billing/b");
    let cfg = Config::parse("test.toml", &served).unwrap();
    assert_eq!(cfg.namespaces.names().unwrap(), ["billing", "default"]);
    assert_eq!(Config::parse("test.toml", GOOD).unwrap().namespaces, solocron_core::Namespaces::default());
    let cases = [
        (with("name = \"b\"\nnamespace = \"shipping\""), "test.toml: jobs[1] (shipping/b).namespace: is in namespace `shipping`, which this node does not serve (billing, default)"),
        (with("name = \"shipping/b\""), "test.toml: jobs[1] (shipping/b).name: is in namespace `shipping`"),
        (with("name = \"b\"\nnamespace = \"Billing\""), "test.toml: jobs[1] (b).namespace: `Billing` is not a namespace name; a namespace is 1 to 63 characters"),
        (with("name = \"x/y\"\nnamespace = \"default\""), "test.toml: jobs[1].name: `x/y` is in namespace `default`, where a name holds no `/`"),
        (with("name = \"Ops/b\""), "test.toml: jobs[1].name: job name `Ops/b`: the part before its first `/` is its namespace, and `Ops` is not a namespace name"),
        (GOOD.replace("[node]", "[node]\nnamespaces = [\"a\", \"B\"]"), "test.toml: node.namespaces[1]: `B` is not a namespace name"),
        (GOOD.replace("[node]", "[node]\nnamespaces = []"), "test.toml: node.namespaces: 0 namespaces; a node serves 1 to 64"),
    ];
    for (toml, want) in cases {
        let e = error_of(&toml);
        assert!(e.starts_with(want), "expected `{want}` at the start of: {e}");
    }
}

#[test]
fn an_unknown_key_is_named_once_with_the_likeliest_meant_and_the_keys_of_its_table() {
    let e = error_of(&GOOD.replace("name = \"b\"", "name = \"b\"\nschedul = \"x\""));
    assert!(e.starts_with("test.toml: jobs[1] (b).schedul: unknown key (line 15); did you mean `schedule`?"), "{e}");
    assert!(e.contains("The keys here are: name, schedule, command, timezone"), "{e}");
    assert_eq!(e.matches("schedul`").count() + e.matches(".schedul:").count(), 1, "named once: {e}");
    let e = error_of(&GOOD.replace("[node]", "[nodes]"));
    assert!(e.starts_with("test.toml: nodes: unknown key (line 4); did you mean `node`?"), "{e}");
    let e = error_of(&format!("{GOOD}retries = 3\n"));
    assert!(e.starts_with("test.toml: jobs[1] (b).retries: unknown key"), "{e}");
    assert!(!e.contains("did you mean"), "nothing is close to `retries`: {e}");
}

#[test]
fn a_bad_job_name_is_refused_by_the_core_rule_at_its_file_and_key() {
    let long = "x".repeat(solocron_core::JOB_NAME_CHARS_MAX + 1);
    let cases = [
        ("a@b", "test.toml: jobs[1].name: job name `a@b` contains `@`, which separates the parts of a run id"),
        ("b#2", "test.toml: jobs[1].name: job name `b#2` contains `#`"),
        ("", "test.toml: jobs[1].name: the job name is empty"),
        ("nightly backup", "test.toml: jobs[1].name: job name `nightly backup` contains a space"),
        ("b\\u0007", "test.toml: jobs[1].name: job name `b\\u{7}` contains a control character (U+0007)"),
        (&long, "test.toml: jobs[1].name: job name `xxxx"),
    ];
    for (name, want) in cases {
        let e = error_of(&GOOD.replace("name = \"b\"", &format!("name = \"{name}\"")));
        assert!(e.starts_with(want), "{name}: expected `{want}` at the start of: {e}");
        assert!(e.contains("a job name is 1 to 191 characters with no whitespace"), "says what is allowed: {e}");
    }
    let missing = error_of(&GOOD.replace("name = \"b\"\n", ""));
    assert_eq!(missing, "test.toml: jobs[1].name: is required");
    for fine in ["billing.invoices-daily", "日次"] {
        let c = Config::parse("test.toml", &GOOD.replace("name = \"b\"", &format!("name = \"{fine}\""))).unwrap();
        assert_eq!(c.jobs[1].name, fine);
    }
}

#[test]
fn one_prefix_names_the_namespace_and_its_old_names_say_what_to_write() {
    let with = |line: &str| GOOD.replace("url = \"sqlite://x.db\"", &format!("url = \"sqlite://x.db\"\n{line}"));
    let c = Config::parse("test.toml", &with("prefix = \"billing\"")).unwrap();
    assert_eq!(c.store.prefix.as_str(), "billing");
    let cases = [
        ("table_prefix = \"solocron_\"", "store.table_prefix: became `prefix`", "-> `prefix = \"solocron\"`"),
        ("table_prefix = \"billing_\"", "store.table_prefix", "-> `prefix = \"billing\"`"),
        ("key_prefix = \"{billing}:\"", "store.key_prefix: became `prefix`", "-> `prefix = \"billing\"`"),
        ("key_prefix = \"/billing/\"", "store.key_prefix", "-> `prefix = \"billing\"`"),
        ("table_prefix = \"_Odd\"", "store.table_prefix", "bad prefix `_Odd`"),
    ];
    for (line, key, advice) in cases {
        let e = error_of(&with(line));
        assert!(e.starts_with("test.toml: ") && e.contains(key) && e.contains(advice), "{line}: {e}");
    }
}

const HTTP: &str = r#"
[[jobs]]
name = "sync"
schedule = "0 */5 * * * *"
http = { url = "https://billing.internal/jobs/sync", method = "PUT", headers = { "Content-Type" = "application/json" }, headers_env = { Authorization = "SERVICE_TOKEN" }, headers_file = { X-Api-Key = "/run/secrets/key" }, body = "{}", timeout = "30s", expect_status = "2xx,304", ca_file = "/etc/ssl/private-ca.pem" }
"#;

#[test]
fn an_http_job_is_a_request_whose_timeout_is_the_jobs_and_whose_secrets_stay_unread() {
    let c = Config::parse("test.toml", HTTP).unwrap();
    let Work::Http(w) = &c.jobs[0].work else { panic!("{:?}", c.jobs[0].work) };
    assert_eq!(c.jobs[0].policy.timeout, Some(Duration::from_secs(30)));
    assert_eq!(w.ca_file.as_deref(), Some("/etc/ssl/private-ca.pem"));
    // Their keys within the job; `wiring::job_of` names them in the file, `jobs[0] (sync).`
    // before (tests/http_jobs.rs reads a variable that is not set).
    let secrets: Vec<(String, &str, &SecretSource)> =
        w.secret_headers.iter().map(|h| (h.key(), h.name.as_str(), &h.source)).collect();
    assert_eq!(
        secrets,
        [
            ("http.headers_env.Authorization".to_owned(), "Authorization", &SecretSource::Env("SERVICE_TOKEN".into())),
            ("http.headers_file.X-Api-Key".to_owned(), "X-Api-Key", &SecretSource::File("/run/secrets/key".into()))
        ]
    );
    let fingerprint = solocron::spec::request(w).unwrap().fingerprint();
    assert!(fingerprint.starts_with("http PUT https://billing.internal/jobs/sync"), "{fingerprint}");
    assert!(fingerprint.contains("expect 2xx,304"), "{fingerprint}");
    let toml = "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n[jobs.http]\nurl = \"http://127.0.0.1:8080/x\"\n";
    assert!(matches!(Config::parse("t.toml", toml).unwrap().jobs[0].work, Work::Http(_)), "a [jobs.http] table");
}

#[test]
fn each_bad_http_part_names_its_key() {
    let http = |from: &str, to: &str| {
        assert!(HTTP.contains(from), "{from}");
        HTTP.replace(from, to)
    };
    let cases = [
        (http("http = {", "command = [\"/bin/true\"]\nhttp = {"), "jobs[0] (sync).http: a job runs a `command` or calls `http`, not both"),
        (http("https://billing", "ftp://billing"), "jobs[0] (sync).http.url: `ftp://billing.internal/jobs/sync` must start with http:// or https://"),
        (http("url = \"https://billing.internal/jobs/sync\"", "url = \"https://ops:pw@\""), "jobs[0] (sync).http.url: `https://ops:***@` "),
        (http("url = \"https://billing.internal/jobs/sync\", ", ""), "jobs[0] (sync).http.url: is required"),
        (http("2xx,304", "2xx,abc"), "jobs[0] (sync).http.expect_status: `abc` is not a status"),
        (http("\"PUT\"", "\"P T\""), "jobs[0] (sync).http.method: `P T` is not an HTTP method"),
        (http("\"Content-Type\"", "\"Idempotency-Key\""), "jobs[0] (sync).http.headers.Idempotency-Key: `Idempotency-Key` is set by solocron"),
        (http("X-Api-Key", "Authorization"), "jobs[0] (sync).http.headers_file.Authorization: `Authorization` is set twice"),
        (http("\"SERVICE_TOKEN\"", "\"\""), "jobs[0] (sync).http.headers_env.Authorization: must name an environment variable"),
        (http("timeout = \"30s\"", "timeout = \"30 parsecs\""), "jobs[0] (sync).http.timeout"),
        (http("schedule =", "timeout = \"1m\"\nschedule ="), "jobs[0] (sync).http.timeout: is the job's timeout: set `timeout` or `http.timeout`, not both"),
        (http("ca_file = \"/etc/ssl/private-ca.pem\"", "ca_file = \"\""), "jobs[0] (sync).http.ca_file: must name"),
        (http("url =", "urll = \"x\", url ="), "jobs[0] (sync).http.urll: unknown key (line 5); did you mean `url`?"),
        (http("\"2xx,304\"", "200"), "jobs[0] (sync).http.expect_status: must be a string, not an integer `200` (line 5)"),
        (http("\"/run/secrets/key\"", "3"), "jobs[0] (sync).http.headers_file.X-Api-Key: must be a string"),
        (http("name = \"sync\"", "name = \"sync\"\n[defaults.http]\nurl = \"http://x\"\n[[jobs]]\nname = \"x\""), "defaults.http: cannot be defaulted"),
        (
            "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n[jobs.http]\nurl = \"http://h/\"\nmethd = \"GET\"\n".into(),
            "jobs[0] (s).http.methd: unknown key (line 6); did you mean `method`? The keys here are: url, method, headers",
        ),
        (
            "[[jobs]]\nname = \"s\"\nschedule = \"* * * * *\"\n".into(),
            "jobs[0] (s).command: is required (an argv array, e.g. [\"/usr/bin/env\", \"sh\", \"-c\", \"echo hi\"]), or instead http = { url",
        ),
    ];
    for (toml, want) in cases {
        let e = error_of(&toml);
        assert!(e.starts_with(&format!("test.toml: {want}")), "expected `test.toml: {want}` at the start of: {e}");
        assert!(!e.contains(":pw@"), "{e}");
    }
}

#[test]
fn a_relative_sqlite_path_is_relative_to_the_configuration_file() {
    let dir = Path::new("/etc/solocron");
    assert_eq!(rebase_sqlite("sqlite://app.db", dir).as_deref(), Some("sqlite:///etc/solocron/app.db"));
    assert_eq!(rebase_sqlite("sqlite:data/app.db", dir).as_deref(), Some("sqlite:///etc/solocron/data/app.db"));
    assert_eq!(rebase_sqlite("sqlite://app.db", Path::new("sub")).as_deref(), Some("sqlite://sub/app.db"));
    assert_eq!(rebase_sqlite("sqlite:///var/app.db", dir), None, "absolute stays");
    assert_eq!(rebase_sqlite("sqlite://app.db", Path::new("")), None, "a file in the current directory");
    assert_eq!(rebase_sqlite("postgres://db/app", dir), None);
}
