//! The JSON API under `/api/v1`: each handler reads or acts through `solocron-fleet`, and
//! its `#[utoipa::path]` is what the OpenAPI document says of it.

use std::time::Duration;

use axum::extract::{FromRequestParts, MatchedPath, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use solocron_core::{ActionQuery, RunState};
use solocron_fleet::{
    ActionView, Actor, Fleet, JobDetail, JobFilter, JobStateFilter, JobWritten, NodeView, RevisionView, RunDetail,
    RunFilter, RunView, Triggered,
};
use utoipa::{IntoParams, ToSchema};

use crate::auth::{Caller, Role};
use crate::extract::{Body, Query};
use crate::problem::Problem;
use crate::AppState;
use solocron_fleet::{JobList, Page};

/// Most actions one `GET /api/v1/actions` returns.
pub const ACTIONS_PAGE_MAX: usize = 500;

/// One path segment (a job name, a run id), percent-decoded; a bad one is a problem.
pub struct Segment(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        // The route's own name for the segment (`job`, `id`), as the document names it.
        let name = parts.extensions.get::<MatchedPath>().and_then(|m| {
            let (_, last) = m.as_str().rsplit_once('{')?;
            last.split_once('}').map(|(name, _)| name.to_owned())
        });
        Path::<String>::from_request_parts(parts, state).await.map(|Path(s)| Segment(s)).map_err(|_| {
            Problem::bad_param(name.as_deref().unwrap_or("path"), "must be UTF-8 text once percent-decoded")
        })
    }
}

/// `limit` within 1 to `max`, else the problem the query's own check words the same way.
fn limit(given: Option<usize>, default: usize, max: usize) -> Result<usize, Problem> {
    match given {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(Problem::bad_param("limit", format!("must be a whole number from 1 to {max}, got \"{n}\""))),
    }
}

/// The name of a job a PUT writes, checked here (the fleet checks it too) so that its
/// refusal names the parameter once.
fn job_name(job: &str) -> Result<(), Problem> {
    use solocron_core::JobNameError as E;
    let Err(e) = solocron_core::validate_job_name(job) else { return Ok(()) };
    let why = match e {
        E::Empty => "must not be empty".to_owned(),
        E::TooLong { chars, .. } => format!("is {chars} characters long"),
        E::Forbidden { found: c @ ('@' | '#'), .. } => format!("contains `{c}`"),
        E::Forbidden { found: ' ', .. } => "contains a space".to_owned(),
        E::Forbidden { found, .. } if found.is_whitespace() => {
            format!("contains whitespace (U+{:04X})", u32::from(found))
        }
        E::Forbidden { found, .. } => format!("contains a control character (U+{:04X})", u32::from(found)),
        E::Namespace { why, .. } => {
            // `why` says the rule of namespaces; the rest of the name's rule is beside the point.
            let got = crate::takes::shown_text(job);
            return Err(Problem::bad_param(
                "job",
                format!("has a wrong namespace part (before the first `/`; got {got}): {why}"),
            ));
        }
    };
    // Core's message names the job again ("job name `x` ..."); the problem names the
    // parameter already, so the rule is said here in the API's own words.
    let rule = format!(
        "a name is 1 to {} characters with no whitespace, no control characters, no `@` and no `#` \
         (they separate a run id's parts), and a `/` only after a namespace (like backup or billing/sync)",
        solocron_core::JOB_NAME_CHARS_MAX
    );
    Err(Problem::bad_param("job", format!("{why} (got {}); {rule}", crate::takes::shown_text(job))))
}

/// A namespace filter, checked here so that its refusal names the parameter once.
fn namespace(given: Option<String>) -> Result<Option<String>, Problem> {
    match given {
        Some(ns) if solocron_core::validate_namespace(&ns).is_err() => Err(Problem::bad_param(
            "namespace",
            format!(
                "must be 1 to {} characters of a-z, 0-9, - and _, starting with a letter or a digit (like billing), got {}",
                solocron_core::NAMESPACE_LEN_MAX,
                crate::takes::shown_text(&ns)
            ),
        )),
        ns => Ok(ns),
    }
}

async fn fleet(state: &AppState) -> Result<Fleet, Problem> {
    Ok(Fleet::read_names(state.store(), state.declared().as_ref().clone()).await?)
}

/// A run state to filter by.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStateParam {
    /// Claimed, its holder renewing its lease.
    Running,
    /// Ended successfully.
    Succeeded,
    /// Ended with an error.
    Failed,
    /// Stopped at its timeout.
    TimedOut,
    /// Its holder lost the lease.
    Lost,
    /// Its holder vanished, or an operator ended it.
    Abandoned,
    /// Recorded without running (overlap, missed, paused).
    Skipped,
    /// Stopped by its node's shutdown.
    Interrupted,
    /// A failure retry waiting for its backoff to pass (`lease_until` is its not-before).
    Waiting,
}

impl RunStateParam {
    fn run_state(self) -> RunState {
        match self {
            RunStateParam::Running => RunState::Running,
            RunStateParam::Succeeded => RunState::Succeeded,
            RunStateParam::Failed => RunState::Failed,
            RunStateParam::TimedOut => RunState::TimedOut,
            RunStateParam::Lost => RunState::Lost,
            RunStateParam::Abandoned => RunState::Abandoned,
            RunStateParam::Skipped => RunState::Skipped,
            RunStateParam::Interrupted => RunState::Interrupted,
            RunStateParam::Waiting => RunState::Waiting,
        }
    }
}

/// Query of `GET /api/v1/jobs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct JobsQuery {
    /// Only names containing this (case-insensitive).
    pub search: Option<String>,
    /// Only jobs in this state.
    // Inline, so that a refusal can say the states (the check reads no `$ref`).
    #[param(inline)]
    pub state: Option<JobStateFilter>,
    /// Only jobs of this namespace (the part of a job's name before its first `/`, else
    /// `default`).
    #[param(pattern = r"^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub namespace: Option<String>,
    /// The previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Jobs per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<usize>,
}

/// The fleet's jobs, by name, one page at a time.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", params(JobsQuery),
    responses((status = 200, body = JobList)),
    security(("bearer" = []), ()))]
pub async fn jobs(
    _: Caller,
    State(state): State<AppState>,
    Query(q): Query<JobsQuery>,
) -> Result<Json<JobList>, Problem> {
    let filter = JobFilter {
        search: q.search,
        state: q.state,
        namespace: namespace(q.namespace)?,
        cursor: q.cursor,
        // 0: the fleet's default page.
        limit: limit(q.limit, 0, solocron_fleet::JOBS_PAGE_MAX)?,
    };
    let fleet = fleet(&state).await?;
    Ok(Json(fleet.jobs(state.store(), &filter).await?.into()))
}

/// One job: policies, next fire times, recent runs, counts by state over 24 hours, actions.
#[utoipa::path(get, path = "/api/v1/jobs/{job}", tag = "jobs", params(("job" = String, Path, description = "The job's name")),
    responses((status = 200, body = JobDetail), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = []), ()))]
pub async fn job(_: Caller, State(state): State<AppState>, Segment(job): Segment) -> Result<Json<JobDetail>, Problem> {
    let fleet = fleet(&state).await?;
    Ok(Json(fleet.job(state.store(), &job).await?))
}

/// The revision a write expects, from `If-Match: "7"` (the job is at revision 7) or
/// `If-None-Match: *` (the job does not exist yet); neither: whatever it is.
pub struct Expect(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for Expect {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let header = |name| parts.headers.get(name).map(|v| v.to_str().unwrap_or("").trim().to_owned());
        match header(axum::http::header::IF_NONE_MATCH) {
            Some(v) if v == "*" => return Ok(Expect(Some(0))),
            // Only `*` says "only if it does not exist"; anything else would be read as no
            // condition at all, and a write the caller meant to guard would go through.
            Some(v) => {
                let got = crate::takes::shown_text(&v);
                return Err(Problem::bad_param("If-None-Match", format!("must be * (only a new job), got {got}")));
            }
            None => {}
        }
        match header(axum::http::header::IF_MATCH) {
            None => Ok(Expect(None)),
            Some(v) => v.trim_matches('"').parse::<u64>().map(|r| Expect(Some(r))).map_err(|_| {
                let got = crate::takes::shown_text(&v);
                Problem::bad_param(
                    "If-Match",
                    format!(
                        "must be the revision the job is expected at, such as \"7\" (from a GET or a write), got {got}"
                    ),
                )
            }),
        }
    }
}

/// The conditional headers of a managed job's write, as the OpenAPI document describes them
/// ([`Expect`] reads them).
#[allow(dead_code)]
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct WriteHeaders {
    /// Write only if the job is at this revision, e.g. `"7"` (from a GET or a write).
    #[serde(rename = "If-Match")]
    #[param(pattern = r#"^"?[0-9]{1,19}"?$"#)]
    pub if_match: Option<String>,
    /// `*`: write only if the job does not exist yet.
    #[serde(rename = "If-None-Match")]
    #[param(pattern = r"^\*$")]
    pub if_none_match: Option<String>,
}

/// A managed job's definition as a PUT carries it: a JSON object, read as a
/// `solocron_spec::JobSpec` by the fleet after the checks of who writes and what job, so
/// each refusal names its key in the spec checker's words (the document shows `JobSpec`).
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub struct Definition(serde_json::Map<String, serde_json::Value>);

impl utoipa::PartialSchema for Definition {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::Object).into()
    }
}

impl ToSchema for Definition {}

/// Creates or replaces a managed job: its definition is a `[[jobs]]` entry's keys (a
/// `JobSpec`; `name` left out or equal), checked exactly as a configuration's job, a bad
/// key named; every change is a revision.
#[utoipa::path(put, path = "/api/v1/jobs/{job}", tag = "jobs",
    params(("job" = String, Path, description = "The job's name"), WriteHeaders),
    request_body(content = solocron_spec::JobSpec, content_type = "application/json", description = "The definition: a `[[jobs]]` entry's keys"),
    responses((status = 200, body = JobWritten), (status = 409, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn put_job(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Expect(expect): Expect,
    Body(Definition(definition)): Body<Definition>,
) -> Result<Json<JobWritten>, Problem> {
    let actor = Actor { by: caller.operator()?.to_owned(), reason: None };
    job_name(&job)?;
    let definition = serde_json::Value::Object(definition);
    let (declared, commands) = (state.declared(), state.allow_command_jobs());
    Ok(Json(solocron_fleet::put_job(state.store(), &declared, commands, &job, &definition, &actor, expect).await?))
}

/// Deletes a managed job; a run of it in progress finishes.
#[utoipa::path(delete, path = "/api/v1/jobs/{job}", tag = "jobs",
    params(("job" = String, Path, description = "The job's name"), WriteHeaders),
    responses((status = 200, body = JobWritten), (status = 404, body = Problem, content_type = "application/problem+json"), (status = 409, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn delete_job(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Expect(expect): Expect,
) -> Result<Json<JobWritten>, Problem> {
    let actor = Actor { by: caller.operator()?.to_owned(), reason: None };
    Ok(Json(solocron_fleet::delete_job(state.store(), &job, &actor, expect).await?))
}

/// Query of a job's revisions.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RevisionsQuery {
    /// At most this many (1..=1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// A managed job's revisions, newest first: who changed what, and when (the newest `limit`,
/// one page).
#[utoipa::path(get, path = "/api/v1/jobs/{job}/revisions", tag = "jobs",
    params(("job" = String, Path, description = "The job's name"), RevisionsQuery),
    responses((status = 200, body = Page<RevisionView>)),
    security(("bearer" = []), ()))]
pub async fn revisions(
    _: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Query(q): Query<RevisionsQuery>,
) -> Result<Json<Page<RevisionView>>, Problem> {
    let limit = limit(q.limit, 50, solocron_core::REVISIONS_PAGE_MAX)?;
    Ok(Json(Page::whole(solocron_fleet::revisions(state.store(), Some(&job), limit).await?)))
}

/// Body of pause and resume.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasonBody {
    /// Why (recorded in the audit log). Pausing again without a reason keeps the earlier one.
    pub reason: Option<String>,
}

/// Pauses the job for the whole fleet: its ticks are recorded as skipped, naming who paused it.
#[utoipa::path(post, path = "/api/v1/jobs/{job}/pause", tag = "actions", params(("job" = String, Path, description = "The job's name")),
    request_body(content = Option<ReasonBody>, content_type = "application/json"),
    responses((status = 200, description = "The audit record", body = ActionView), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn pause(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Body(body): Body<ReasonBody>,
) -> Result<Json<ActionView>, Problem> {
    let actor = Actor { by: caller.operator()?.to_owned(), reason: body.reason };
    let fleet = fleet(&state).await?;
    Ok(Json(solocron_fleet::pause(state.store(), &fleet, &job, &actor).await?))
}

/// Resumes a paused job.
#[utoipa::path(post, path = "/api/v1/jobs/{job}/resume", tag = "actions", params(("job" = String, Path, description = "The job's name")),
    request_body(content = Option<ReasonBody>, content_type = "application/json"),
    responses((status = 200, description = "The audit record", body = ActionView), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn resume(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Body(body): Body<ReasonBody>,
) -> Result<Json<ActionView>, Problem> {
    let actor = Actor { by: caller.operator()?.to_owned(), reason: body.reason };
    let fleet = fleet(&state).await?;
    Ok(Json(solocron_fleet::resume(state.store(), &fleet, &job, &actor).await?))
}

/// Body of unlock.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnlockBody {
    /// Why the running runs are ended (required; recorded in each run and the audit log).
    #[schema(min_length = 1, pattern = "\\S")]
    pub reason: String,
}

/// What an unlock ended.
#[derive(Debug, Serialize, ToSchema)]
pub struct Unlocked {
    /// The runs ended as abandoned (none when nothing was running).
    pub ended: Vec<String>,
}

/// Ends the job's running runs as abandoned; their holders, if alive, stop at their next renewal.
#[utoipa::path(post, path = "/api/v1/jobs/{job}/unlock", tag = "actions", params(("job" = String, Path, description = "The job's name")),
    request_body(content = UnlockBody, content_type = "application/json"),
    responses((status = 200, body = Unlocked), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn unlock(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Body(body): Body<UnlockBody>,
) -> Result<Json<Unlocked>, Problem> {
    let by = caller.operator()?.to_owned();
    if body.reason.trim().is_empty() {
        return Err(Problem::bad_param("reason", "must not be blank: say why the run is ended; it is recorded"));
    }
    let actor = Actor { by, reason: Some(body.reason) };
    let fleet = fleet(&state).await?;
    let ended = solocron_fleet::unlock(state.store(), &fleet, &job, &actor).await?;
    Ok(Json(Unlocked { ended: ended.iter().map(ToString::to_string).collect() }))
}

/// Body of trigger.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// Why (recorded in the audit log).
    pub reason: Option<String>,
    /// Wait this many seconds (at most 3600) for the run to end before answering.
    /// (A JSON number: JSON Schema counts `5.0` as the integer 5, so it is read as one.)
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 3600)]
    pub wait_seconds: Option<f64>,
}

/// What a trigger did.
#[derive(Debug, Serialize, ToSchema)]
pub struct TriggerAnswer {
    /// The manual run's id (its first attempt).
    pub run_id: String,
    /// requested (a node picks it up within a second), still_running (the wait ran out), or
    /// the ended run's state.
    pub state: String,
    /// The ended run (its newest attempt), when the trigger waited for it.
    pub run: Option<RunView>,
}

/// Asks for one run of the job now; a running node serving the job claims it within a second.
#[utoipa::path(post, path = "/api/v1/jobs/{job}/trigger", tag = "actions", params(("job" = String, Path, description = "The job's name")),
    request_body(content = Option<TriggerBody>, content_type = "application/json"),
    responses((status = 200, description = "The run ended (with wait_seconds)", body = TriggerAnswer), (status = 202, description = "Requested, or still running when the wait ran out", body = TriggerAnswer), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = [])))]
pub async fn trigger(
    caller: Caller,
    State(state): State<AppState>,
    Segment(job): Segment,
    Body(body): Body<TriggerBody>,
) -> Result<Response, Problem> {
    let actor = Actor { by: caller.operator()?.to_owned(), reason: body.reason };
    let fleet = fleet(&state).await?;
    let wait = body.wait_seconds.map(wait_seconds).transpose()?;
    let answer = match solocron_fleet::trigger(state.store(), &fleet, &job, &actor, wait).await? {
        Triggered::Requested(id) => {
            (StatusCode::ACCEPTED, TriggerAnswer { run_id: id, state: "requested".into(), run: None })
        }
        Triggered::StillRunning(id) => {
            (StatusCode::ACCEPTED, TriggerAnswer { run_id: id, state: "still_running".into(), run: None })
        }
        Triggered::Ended(run) => {
            let id = run.id.rsplit_once('#').map_or(run.id.clone(), |(t, _)| format!("{t}#1"));
            (StatusCode::OK, TriggerAnswer { run_id: id, state: run.state.clone(), run: Some(*run) })
        }
    };
    Ok((answer.0, Json(answer.1)).into_response())
}

/// `wait_seconds` as a duration: a whole number of seconds, at most an hour.
fn wait_seconds(s: f64) -> Result<Duration, Problem> {
    if s.fract() != 0.0 || !(0.0..=3600.0).contains(&s) {
        return Err(Problem::bad_param("wait_seconds", format!("must be a whole number from 0 to 3600, got {s}")));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Query of `GET /api/v1/runs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Only this job's runs.
    pub job: Option<String>,
    /// Only runs of this namespace's jobs.
    #[param(pattern = r"^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub namespace: Option<String>,
    /// Only runs in this state.
    // Inline, so that a refusal can say the states (the check reads no `$ref`).
    #[param(inline)]
    pub state: Option<RunStateParam>,
    /// Only runs claimed by this node.
    pub node: Option<String>,
    /// Only ticks scheduled at or after this RFC 3339 instant.
    pub since: Option<DateTime<Utc>>,
    /// Only ticks scheduled before this RFC 3339 instant.
    pub until: Option<DateTime<Utc>>,
    /// The previous page's `next_cursor` (an instant: the page shows runs scheduled before it).
    pub cursor: Option<DateTime<Utc>>,
    /// Runs per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
}

/// The run history, newest first, one page at a time.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs", params(RunsQuery),
    responses((status = 200, body = Page<RunView>)),
    security(("bearer" = []), ()))]
pub async fn runs(
    _: Caller,
    State(state): State<AppState>,
    Query(q): Query<RunsQuery>,
) -> Result<Json<Page<RunView>>, Problem> {
    let run_state = q.state.map(RunStateParam::run_state);
    let filter = RunFilter {
        job: q.job,
        namespace: namespace(q.namespace)?,
        state: run_state,
        node: q.node,
        since: q.since,
        until: q.until,
        cursor: q.cursor.map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        // 0: the fleet's default page.
        limit: limit(q.limit, 0, solocron_fleet::RUNS_PAGE_MAX)?,
    };
    Ok(Json(solocron_fleet::runs_page(state.store(), &filter).await?.into()))
}

/// One run: the whole record, its output tail, and every attempt at its tick.
#[utoipa::path(get, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run id, `job@instant#attempt` (percent-encode `#` as %23)")),
    responses((status = 200, body = RunDetail), (status = 404, body = Problem, content_type = "application/problem+json")),
    security(("bearer" = []), ()))]
pub async fn run(_: Caller, State(state): State<AppState>, Segment(id): Segment) -> Result<Json<RunDetail>, Problem> {
    Ok(Json(solocron_fleet::run_detail(state.store(), &id).await?))
}

/// The nodes: alive (heartbeat within 15 s), stale (silent, no goodbye) or gone (said
/// goodbye); all of them, one page.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes",
    responses((status = 200, body = Page<NodeView>)),
    security(("bearer" = []), ()))]
pub async fn nodes(_: Caller, State(state): State<AppState>) -> Result<Json<Page<NodeView>>, Problem> {
    Ok(Json(Page::whole(fleet(&state).await?.nodes())))
}

/// Query of `GET /api/v1/actions`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ActionsQuery {
    /// Only this job's actions.
    pub job: Option<String>,
    /// At most this many, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
}

/// The audit log: operators' actions, newest first (the newest `limit`, one page).
#[utoipa::path(get, path = "/api/v1/actions", tag = "actions", params(ActionsQuery),
    responses((status = 200, body = Page<ActionView>)),
    security(("bearer" = []), ()))]
pub async fn actions(
    _: Caller,
    State(state): State<AppState>,
    Query(q): Query<ActionsQuery>,
) -> Result<Json<Page<ActionView>>, Problem> {
    let limit = limit(q.limit, 50, ACTIONS_PAGE_MAX)?;
    let found =
        state.store().actions(&ActionQuery { job: q.job, limit }).await.map_err(solocron_fleet::FleetError::from)?;
    Ok(Json(Page::whole(found.iter().map(ActionView::from).collect())))
}

/// Who the token belongs to and what it may do.
#[derive(Debug, Serialize, ToSchema)]
pub struct Whoami {
    /// The token's name (`anonymous` when the server has no tokens).
    pub name: String,
    /// The token's role (absent without tokens: read only).
    pub role: Option<Role>,
    /// Whether actions are allowed.
    pub can_act: bool,
}

/// The caller, as their token says; the console shows action buttons only when `can_act`.
#[utoipa::path(get, path = "/api/v1/whoami", tag = "auth",
    responses((status = 200, body = Whoami)),
    security(("bearer" = []), ()))]
pub async fn whoami(caller: Caller) -> Json<Whoami> {
    let can_act = caller.role == Some(Role::Operate);
    Json(Whoami { name: caller.name, role: caller.role, can_act })
}
