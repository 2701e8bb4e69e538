//! The API's errors: each says its HTTP status and renders as `{"error":{"code","message"}}`.
//! The `code` strings are stable (scripts match on them); [`CODES`] lists them, and a test
//! checks the list against the OpenAPI document.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or not the right one (`token_given`: one was presented).
    #[error("a valid bearer token is required")]
    Unauthorized { token_given: bool },
    #[error("{0}")]
    BadRequest(String),
    #[error("no queue {0}")]
    NotFound(String),
    /// Not found, said in full (`no account X`, `no key Y`).
    #[error("{0}")]
    NoSuch(String),
    /// The caller may not do this (a read-only key, an operator-only route).
    #[error("{0}")]
    Forbidden(String),
    /// An account's limit (queues at most, tiers allowed) refuses it.
    #[error("{0}")]
    LimitReached(String),
    #[error("no such route")]
    NoSuchRoute,
    /// The route is there, not for this method (axum adds `Allow`, the ones it takes).
    #[error("this route does not take that method")]
    MethodNotAllowed,
    #[error("the request body is larger than this route takes")]
    PayloadTooLarge,
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("no certificate has been issued yet")]
    NoCertificate,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
    /// Something the request needs is not to be had now (a CA that does not answer).
    #[error("{0}")]
    Unavailable(String),
    /// Asked again too soon; it may be asked again in this many seconds.
    #[error("asked too often: again in {0} s")]
    TooManyRequests(u64),
}

/// Every `code` an error may carry.
pub const CODES: [&str; 12] = [
    "unauthorized",
    "forbidden",
    "limit_reached",
    "bad_request",
    "not_found",
    "method_not_allowed",
    "payload_too_large",
    "unsupported_media_type",
    "conflict",
    "internal",
    "unavailable",
    "too_many_requests",
];

impl ApiError {
    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::NotFound(_)
            | ApiError::NoSuch(_)
            | ApiError::NoSuchRoute
            | ApiError::NoCertificate => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::LimitReached(_) => (StatusCode::FORBIDDEN, "limit_reached"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = serde_json::json!({"error": {"code": code, "message": self.to_string()}});
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            ApiError::TooManyRequests(seconds) => {
                let value = axum::http::HeaderValue::from(seconds);
                headers.insert(axum::http::header::RETRY_AFTER, value);
            }
            // The challenge of RFC 6750 §3: the scheme, and why a token given was refused.
            ApiError::Unauthorized { token_given } => {
                let challenge = match token_given {
                    true => r#"Bearer error="invalid_token""#,
                    false => "Bearer",
                };
                let value = axum::http::HeaderValue::from_static(challenge);
                headers.insert(axum::http::header::WWW_AUTHENTICATE, value);
            }
            _ => {}
        }
        response
    }
}

impl From<crate::store::StoreError> for ApiError {
    /// The store out of reach (etcd without a majority) or this replica's leadership over:
    /// `503`, to be tried again (through another replica); anything else is ours to fix.
    fn from(error: crate::store::StoreError) -> ApiError {
        use crate::store::StoreError;
        match error {
            StoreError::Unavailable(_) | StoreError::NotLeader => {
                ApiError::Unavailable(error.to_string())
            }
            // A write whose sync failed may or may not last: a failure, never a success.
            StoreError::Sled(_)
            | StoreError::NotSynced(_)
            | StoreError::Record(_)
            | StoreError::NotEmpty
            | StoreError::Config(_) => ApiError::Internal(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_and_in_the_openapi_document() {
        let errors = [
            ApiError::Unauthorized { token_given: false },
            ApiError::BadRequest(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::NoSuch(String::new()),
            ApiError::Forbidden(String::new()),
            ApiError::LimitReached(String::new()),
            ApiError::NoSuchRoute,
            ApiError::NoCertificate,
            ApiError::MethodNotAllowed,
            ApiError::PayloadTooLarge,
            ApiError::UnsupportedMediaType,
            ApiError::Conflict(String::new()),
            ApiError::Internal(String::new()),
            ApiError::Unavailable(String::new()),
            ApiError::TooManyRequests(1),
        ];
        let mut codes: Vec<&str> = errors.iter().map(|e| e.status_and_code().1).collect();
        codes.sort();
        codes.dedup();
        let mut listed = CODES.to_vec();
        listed.sort();
        assert_eq!(codes, listed);
        let document: serde_json::Value =
            serde_json::from_str(include_str!("../../openapi.json")).unwrap();
        let code = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
            ["code"]["enum"];
        let mut documented: Vec<&str> = code
            .as_array()
            .expect("the Error schema lists its codes")
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        documented.sort();
        assert_eq!(documented, listed);
    }
}
