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
        api::jobs, api::job, api::put_job, api::delete_job, api::revisions, api::pause, api::resume, api::unlock, api::trigger,
        api::runs, api::run, api::nodes, api::actions, api::whoami
    ),
    components(schemas(solocron_fleet::JobStateFilter, api::RunStateParam)),
    modifiers(&Bearer, &UriTooLong),
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

/// Every operation may answer 414: the router refuses a path and query longer than
/// [`crate::health::URI_BYTES_MAX`] before any handler runs.
struct UriTooLong;

impl Modify for UriTooLong {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let response = ResponseBuilder::new()
            .description("The path and query are too long")
            .content(
                "application/problem+json",
                ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
            )
            .build();
        for item in doc.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for op in operations.into_iter().flatten() {
                op.responses.responses.insert("414".into(), response.clone().into());
            }
        }
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
