//! The web console: three hand-written files under `console/` (no framework, no build
//! step), embedded in the binary at build time, so the console served is the one that was
//! tested and nothing is fetched at run time. The page reads the same JSON API as every
//! other client, with the caller's token; it holds no state on the server.
//!
//! Served with a strict Content-Security-Policy: scripts, styles and images from this
//! origin only, no inline script or style, no framing. Job names and run output are
//! untrusted text, and the console only ever writes them with `textContent`; the policy is
//! the second wall should that ever slip.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The console's Content-Security-Policy: this origin only, nothing inline, no framing.
pub const CONSOLE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file, with its type and a digest of its bytes (its ETag).
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    digest: u64,
}

impl Asset {
    const fn new(body: &'static [u8], content_type: &'static str) -> Asset {
        Asset { body, content_type, digest: fnv1a(body) }
    }
}

/// FNV-1a over the file, at compile time: an ETag only needs to change when the bytes do.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

static INDEX: Asset = Asset::new(include_bytes!("../console/index.html"), "text/html; charset=utf-8");
static SCRIPT: Asset = Asset::new(include_bytes!("../console/app.js"), "text/javascript; charset=utf-8");
static STYLE: Asset = Asset::new(include_bytes!("../console/style.css"), "text/css; charset=utf-8");
static ICON: Asset = Asset::new(include_bytes!("../console/icon.svg"), "image/svg+xml");

/// The console's routes: `/` (the page) and its files under `/console/`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { serve(&INDEX, &h) }))
        .route("/console/app.js", get(|h: HeaderMap| async move { serve(&SCRIPT, &h) }))
        .route("/console/style.css", get(|h: HeaderMap| async move { serve(&STYLE, &h) }))
        .route("/console/icon.svg", get(|h: HeaderMap| async move { serve(&ICON, &h) }))
}

/// The file, or 304 when the browser already holds these bytes. `no-cache` makes the browser
/// ask each time, so a new binary's console is seen at once; the ETag keeps that cheap.
fn serve(asset: &'static Asset, request: &HeaderMap) -> Response {
    let etag = HeaderValue::from_str(&format!("\"{:016x}\"", asset.digest)).expect("hex is a valid header value");
    let headers = [
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONSOLE_CSP)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, etag.clone()),
    ];
    if request.get(header::IF_NONE_MATCH) == Some(&etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type))];
    (headers, content_type, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt as _;

    use super::*;

    async fn get(path: &str, etag: Option<&str>) -> Response {
        let mut req = Request::get(path);
        if let Some(e) = etag {
            req = req.header(header::IF_NONE_MATCH, e);
        }
        routes::<()>().oneshot(req.body(Body::empty()).unwrap()).await.unwrap()
    }

    fn text(asset: &Asset) -> &'static str {
        std::str::from_utf8(asset.body).expect("console files are UTF-8")
    }

    #[tokio::test]
    async fn the_page_is_served_with_a_strict_policy() {
        let res = get("/", None).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let csp = res.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    }

    #[tokio::test]
    async fn scripts_styles_and_icon_are_served_with_their_types() {
        for (path, ty) in [
            ("/console/app.js", "text/javascript; charset=utf-8"),
            ("/console/style.css", "text/css; charset=utf-8"),
            ("/console/icon.svg", "image/svg+xml"),
        ] {
            let res = get(path, None).await;
            assert_eq!(res.status(), StatusCode::OK, "{path}");
            assert_eq!(res.headers()[header::CONTENT_TYPE], ty, "{path}");
            assert!(res.headers().contains_key(header::CONTENT_SECURITY_POLICY), "{path}");
        }
        assert_eq!(get("/console/other.js", None).await.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_file_the_browser_holds_is_not_sent_again() {
        let first = get("/console/app.js", None).await;
        let etag = first.headers()[header::ETAG].to_str().unwrap().to_owned();
        let again = get("/console/app.js", Some(&etag)).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let body = axum::body::to_bytes(again.into_body(), 1024).await.unwrap();
        assert!(body.is_empty());
        assert_eq!(get("/console/app.js", Some("\"0\"")).await.status(), StatusCode::OK);
    }

    #[test]
    fn the_page_has_no_inline_script_style_or_handler() {
        let page = text(&INDEX).to_lowercase();
        let scripts: Vec<&str> = page.split("<script").skip(1).collect();
        assert!(!scripts.is_empty());
        for s in scripts {
            let tag = &s[..s.find('>').expect("a closed tag")];
            assert!(tag.contains("src=\"/console/"), "inline script: <script{tag}>");
        }
        assert!(!page.contains("<style"), "inline style element");
        assert!(!page.contains(" style="), "inline style attribute");
        let handler = page.split_whitespace().any(|w| w.starts_with("on") && w.contains('='));
        assert!(!handler, "inline event handler");
    }

    #[test]
    fn the_console_never_turns_strings_into_markup_or_code() {
        let script = text(&SCRIPT);
        for banned in
            ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "srcdoc"]
        {
            assert!(!script.contains(banned), "app.js uses {banned}: untrusted text must go through textContent");
        }
        assert!(!text(&STYLE).contains("@import"), "style.css must not fetch other sheets");
    }
}
