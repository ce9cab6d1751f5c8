//! The extender's HTTP handlers on the shared HTTPS server.

use super::{ExtenderError, BIND_PATH, FILTER_PATH, PRIORITIZE_PATH};
use crate::server::{is_json, method_not_allowed, plain, read_body, Outcome, State};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use std::time::{Duration, Instant};

/// A full NodeList for 5,000 nodes is about 15 MiB.
const MAX_BODY: usize = 64 * 1024 * 1024;
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests up to this size (a NodeNames list of about 3,000 names) are judged on the
/// worker that read them, in well under a millisecond; larger ones on the blocking pool.
const INLINE_BODY: usize = 64 * 1024;

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
    for path in [FILTER_PATH, PRIORITIZE_PATH, BIND_PATH] {
        cfg.route(path, web::to(method_not_allowed));
    }
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
    let now = Instant::now();
    if let Verb::Bind = verb {
        return reply(path, state.extender.bind(&body, now).await, bad);
    }
    let large = body.len() > INLINE_BODY;
    let judge = {
        let state = state.clone();
        move || match verb {
            Verb::Filter => state.extender.filter(&body, now),
            _ => state.extender.prioritize(&body, now),
        }
    };
    // A long list of nodes takes a while to judge: on the blocking pool then, so that the
    // webhooks this worker also serves do not wait behind it (they have 5 s).
    let result = if large {
        match web::block(judge).await {
            Ok(result) => result,
            Err(_) => {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Outcome {
                        path,
                        result: "unavailable",
                    },
                    "the request could not be judged: the server is shutting down".into(),
                )
            }
        }
    } else {
        judge()
    };
    reply(path, result, bad)
}

/// The reply to a judged request: its JSON, or a refusal said by `bad`.
fn reply(
    path: &'static str,
    result: Result<Vec<u8>, ExtenderError>,
    bad: impl FnOnce(String) -> HttpResponse,
) -> HttpResponse {
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
