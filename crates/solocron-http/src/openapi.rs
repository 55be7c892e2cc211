//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` attributes and
//! the views' schemas: it cannot drift from the code.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "solocron API", description = "Exactly-once cron across a fleet: jobs, runs, nodes and audited actions."),
    paths(
        api::jobs, api::job, api::pause, api::resume, api::unlock, api::trigger,
        api::runs, api::run, api::nodes, api::actions, api::whoami
    ),
    components(schemas(solocron_fleet::JobStateFilter, api::RunStateParam)),
    modifiers(&Bearer),
    tags(
        (name = "jobs", description = "The fleet's jobs"),
        (name = "runs", description = "The run history"),
        (name = "nodes", description = "The nodes and their heartbeats"),
        (name = "actions", description = "Operator actions, each recorded in the audit log"),
        (name = "auth", description = "Tokens")
    )
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document, as JSON text.
pub fn openapi_json() -> String {
    ApiDoc::openapi().to_pretty_json().expect("the document serializes")
}

/// `GET /api/v1/openapi.json`: public, it holds no data.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
