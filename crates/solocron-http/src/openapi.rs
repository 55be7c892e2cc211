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
    modifiers(&Bearer, &Problems, &PageItems),
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

/// The problems every operation may answer, documented once here rather than on each
/// handler: 400 (a bad parameter), 401 (no or an unknown token), 414 (the router refuses a
/// path and query longer than [`crate::health::URI_BYTES_MAX`] before any handler runs),
/// 503 (the store did not answer), and 403 for actions (a read-only token).
struct Problems;

impl Modify for Problems {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
                )
                .build()
        };
        let every = [
            ("400", problem("A parameter or the body is not valid; the problem names it")),
            ("401", problem("No token, or one the server does not know")),
            ("414", problem("The path and query are too long")),
            ("503", problem("The store did not answer in time")),
        ];
        let actions = [("403", problem("This token's role may not do this"))];
        for item in doc.paths.paths.values_mut() {
            let reads = [&mut item.get].into_iter().flatten().map(|op| (op, false));
            let acts = [&mut item.put, &mut item.post, &mut item.delete].into_iter().flatten().map(|op| (op, true));
            for (op, is_action) in reads.chain(acts) {
                let extra = if is_action { &actions[..] } else { &[] };
                for (status, response) in every.iter().chain(extra) {
                    op.responses.responses.entry((*status).into()).or_insert_with(|| response.clone().into());
                }
            }
        }
    }
}

/// A page's items as a reference to their schema: utoipa composes `Page<RunView>` with a
/// copy of `RunView` inline (juhaku/utoipa#1586), which client generators would turn into a
/// second type per list.
struct PageItems;

impl Modify for PageItems {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{ArrayItems, Schema};
        use utoipa::openapi::{Ref, RefOr};
        let Some(components) = doc.components.as_mut() else { return };
        let names: Vec<String> = components.schemas.keys().cloned().collect();
        for (name, schema) in &mut components.schemas {
            let Some(item) = name.strip_prefix("Page_").filter(|i| names.iter().any(|n| n == i)) else { continue };
            let RefOr::T(Schema::Object(page)) = schema else { continue };
            if let Some(RefOr::T(Schema::Array(items))) = page.properties.get_mut("items") {
                items.items = ArrayItems::RefOrSchema(Box::new(RefOr::Ref(Ref::from_schema_name(item))));
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
