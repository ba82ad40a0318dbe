//! The one place where failures become HTTP statuses, with OpenAI's error body:
//! `{"error": {"message", "type", "param", "code"}}` (vLLM's shape; `code` is the status).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kern_engine::SubmitError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, for 400s.
    pub param: Option<String>,
    /// Seconds for `Retry-After` (503s).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.into()), retry_after: None }
    }

    /// A 400 not tied to one field (malformed JSON, say).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: None, retry_after: None }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into(), param: None, retry_after: None }
    }

    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), param: None, retry_after: Some(retry_after) }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), param: None, retry_after: None }
    }

    pub fn unauthorized() -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, message: "missing or wrong API key: send `Authorization: Bearer <key>`".into(), param: None, retry_after: None }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::PAYLOAD_TOO_LARGE => "BadRequestError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The error object (also sent as an SSE event when a stream fails mid-way).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.status.as_u16()}})
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match &e {
            SubmitError::Invalid { field, .. } => ApiError::bad(*field, e.to_string()),
            SubmitError::Loading => ApiError::unavailable(e.to_string(), 5),
            SubmitError::Draining => ApiError::unavailable(e.to_string(), 30),
            SubmitError::QueueFull { .. } => ApiError::unavailable(e.to_string(), 1),
            SubmitError::Failed(_) => ApiError::unavailable(e.to_string(), 30),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
