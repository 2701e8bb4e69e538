//! The API's errors: each says its HTTP status and renders as `{"error":{"code","message"}}`.

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
    #[error("no such route")]
    NoSuchRoute,
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

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::NotFound(_) | ApiError::NoSuchRoute | ApiError::NoCertificate => {
                (StatusCode::NOT_FOUND, "not_found")
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
    fn from(error: crate::store::StoreError) -> ApiError {
        ApiError::Internal(error.to_string())
    }
}
