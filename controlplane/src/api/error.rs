//! The API's errors: each says its HTTP status and renders as `{"error":{"code","message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid bearer token is required")]
    Unauthorized,
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
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
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
        if let ApiError::TooManyRequests(seconds) = self {
            let value = axum::http::HeaderValue::from(seconds);
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, value);
        }
        response
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> ApiError {
        ApiError::Internal(error.to_string())
    }
}
