//! The extender's HTTP handlers on the shared HTTPS server.

use super::{ExtenderError, BIND_PATH, FILTER_PATH, PRIORITIZE_PATH};
use crate::server::{is_json, plain, read_body, Outcome, State};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use std::time::{Duration, Instant};

/// A full NodeList for 5,000 nodes is about 15 MiB.
const MAX_BODY: usize = 64 * 1024 * 1024;
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Verb {
    Filter,
    Prioritize,
    Bind,
}

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        FILTER_PATH,
        web::post().to(|s, r, p| handle(Verb::Filter, s, r, p)),
    )
    .route(
        PRIORITIZE_PATH,
        web::post().to(|s, r, p| handle(Verb::Prioritize, s, r, p)),
    )
    .route(
        BIND_PATH,
        web::post().to(|s, r, p| handle(Verb::Bind, s, r, p)),
    );
}

async fn handle(
    verb: Verb,
    state: web::Data<State>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let path = match verb {
        Verb::Filter => FILTER_PATH,
        Verb::Prioritize => PRIORITIZE_PATH,
        Verb::Bind => BIND_PATH,
    };
    let bad = |line: String| {
        let line = crate::text::about_request(&line);
        tracing::warn!(path, reason = %line, "extender request refused");
        plain(
            StatusCode::BAD_REQUEST,
            Outcome {
                path,
                result: "bad_request",
            },
            line,
        )
    };
    if !is_json(&req) {
        return bad(
            "Content-Type is not application/json: send a kube-scheduler extender request".into(),
        );
    }
    let body = match read_body(&req, payload, MAX_BODY, BODY_TIMEOUT, path).await {
        Ok(b) => b,
        Err(res) => return res,
    };
    let extender = &state.extender;
    let now = Instant::now();
    let result = match verb {
        Verb::Filter => extender.filter(&body, now),
        Verb::Prioritize => extender.prioritize(&body, now),
        Verb::Bind => extender.bind(&body, now).await,
    };
    match result {
        Ok(reply) => {
            let mut res = HttpResponse::Ok()
                .content_type("application/json")
                .body(reply);
            res.extensions_mut().insert(Outcome { path, result: "ok" });
            res
        }
        Err(ExtenderError::BadRequest(line)) => bad(line),
    }
}
