//! The SQS face (docs/sqs.md): each node serves its queue to Amazon SQS's SDKs on a port of
//! its own, HTTPS with the queue's certificate (plain HTTP with `--plaintext`), in the AWS
//! JSON 1.0 protocol (`X-Amz-Target: AmazonSQS.*`) and the query protocol older SDKs speak
//! (`query`). Every request is signed (SigV4, `sigv4`) with one of the queue's SQS access
//! keys, whose role decides what it may do, as the WebSocket logins' roles do. Messages are the queue's own: one sent here reaches a
//! WebSocket subscriber, and a receive here takes what no subscriber holds (`actions`).
//!
//! A request's path: [`Sqs::serve`] reads it (bounded), [`Sqs::read_and_handle`] checks its
//! signature and role and picks the action, `actions` runs it on the engine, and the answer
//! or an [`SqsError`] goes back in the request's protocol: AWS's JSON error shape, with the
//! `x-amzn-query-error` header that carries the legacy code SDKs report, or the query
//! protocol's XML with that code.

mod actions;
mod attributes;
mod query;
pub mod sigv4;

use crate::node::Node;
use crate::traffic::Counted;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use qe_shared::protocol::Role;
use qe_shared::settings::Setting;
use serde_json::Value;
use sigv4::header;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// An SQS access key of this queue: what signs requests, and the role it acts as.
#[derive(Clone, PartialEq, Eq)]
pub struct SqsKey {
    pub access_key_id: String,
    pub secret: String,
    pub role: Role,
}

impl std::fmt::Debug for SqsKey {
    /// Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqsKey({} as {:?})", self.access_key_id, self.role)
    }
}

impl SqsKey {
    /// Reads `ROLE:ACCESS_KEY_ID:SECRET` (the `--sqs-key` flag).
    pub fn parse(text: &str) -> Option<SqsKey> {
        let (role, rest) = text.split_once(':')?;
        let (access_key_id, secret) = rest.split_once(':')?;
        let valid_id = !access_key_id.is_empty()
            && access_key_id.len() <= 128
            && access_key_id.bytes().all(|b| b.is_ascii_alphanumeric());
        let role = Role::parse(role)?;
        (valid_id && !secret.is_empty()).then(|| SqsKey {
            access_key_id: access_key_id.to_string(),
            secret: secret.to_string(),
            role,
        })
    }
}

/// An SQS error in AWS's terms: its HTTP status, its JSON `__type`, and the legacy
/// (query-protocol) code the SDKs report, which goes in `x-amzn-query-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    pub status: StatusCode,
    /// The shape's name after `#` in `__type`.
    pub shape: &'static str,
    /// The code boto3 and the other SDKs show (`Error.Code`).
    pub code: &'static str,
    pub message: String,
}

impl SqsError {
    fn new(status: StatusCode, shape: &'static str, code: &'static str, message: String) -> Self {
        SqsError {
            status,
            shape,
            code,
            message,
        }
    }

    pub fn invalid_parameter(message: impl Into<String>) -> SqsError {
        let message = message.into();
        let (shape, code) = ("InvalidParameterValue", "InvalidParameterValue");
        SqsError::new(StatusCode::BAD_REQUEST, shape, code, message)
    }

    pub fn missing_parameter(name: &str) -> SqsError {
        let message = format!("The request must contain the parameter {name}.");
        let (shape, code) = ("MissingParameter", "MissingParameter");
        SqsError::new(StatusCode::BAD_REQUEST, shape, code, message)
    }

    pub fn queue_does_not_exist() -> SqsError {
        SqsError::new(
            StatusCode::BAD_REQUEST,
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            "The specified queue does not exist.".into(),
        )
    }

    pub fn receipt_handle_invalid(handle: &str) -> SqsError {
        let handle = shown(handle);
        SqsError::new(
            StatusCode::BAD_REQUEST,
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
        )
    }

    pub fn message_not_inflight() -> SqsError {
        SqsError::new(
            StatusCode::BAD_REQUEST,
            "MessageNotInflight",
            "AWS.SimpleQueueService.MessageNotInflight",
            "The message referred to isn't in flight.".into(),
        )
    }

    /// A batch's own faults: `shape` is also the name after `AWS.SimpleQueueService.`.
    pub fn batch(shape: &'static str, code: &'static str, message: &str) -> SqsError {
        SqsError::new(StatusCode::BAD_REQUEST, shape, code, message.into())
    }

    fn access_denied(action: &str, role: Role) -> SqsError {
        SqsError::new(
            StatusCode::FORBIDDEN,
            "AccessDeniedException",
            "AccessDenied",
            format!("An access key of the {role:?} role may not call {action}."),
        )
    }

    fn signature(refused: sigv4::Refused) -> SqsError {
        let (shape, code) = match refused {
            sigv4::Refused::Missing => (
                "MissingAuthenticationTokenException",
                "MissingAuthenticationToken",
            ),
            sigv4::Refused::Incomplete(_) => {
                ("IncompleteSignatureException", "IncompleteSignature")
            }
            sigv4::Refused::UnknownKey => ("InvalidClientTokenId", "InvalidClientTokenId"),
            sigv4::Refused::Expired => ("RequestExpired", "RequestExpired"),
            sigv4::Refused::Mismatch => ("InvalidSignatureException", "SignatureDoesNotMatch"),
        };
        SqsError::new(StatusCode::FORBIDDEN, shape, code, refused.to_string())
    }

    pub fn unavailable(message: &str) -> SqsError {
        SqsError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "ServiceUnavailable",
            message.into(),
        )
    }

    pub fn over_limit(message: &str) -> SqsError {
        SqsError::new(
            StatusCode::FORBIDDEN,
            "OverLimit",
            "OverLimit",
            message.into(),
        )
    }

    pub fn purge_in_progress() -> SqsError {
        SqsError::new(
            StatusCode::FORBIDDEN,
            "PurgeQueueInProgress",
            "AWS.SimpleQueueService.PurgeQueueInProgress",
            "Only one PurgeQueue operation on the queue is allowed every 60 seconds.".into(),
        )
    }

    fn unknown_operation(target: &str) -> SqsError {
        SqsError::new(
            StatusCode::BAD_REQUEST,
            "UnknownOperationException",
            "InvalidAction",
            format!(
                "The action {} is not valid for this endpoint.",
                shown(target)
            ),
        )
    }

    fn not_json() -> SqsError {
        SqsError::new(
            StatusCode::BAD_REQUEST,
            "SerializationException",
            "InvalidParameterValue",
            "The request body is not a JSON object.".into(),
        )
    }

    fn too_big() -> SqsError {
        SqsError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestTooLarge",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            "The request is too large.".into(),
        )
    }

    /// The error as AWS's JSON protocol sends it.
    fn response(&self) -> Response<Full<Bytes>> {
        let body = serde_json::json!({
            "__type": format!("com.amazonaws.sqs#{}", self.shape),
            "message": self.message,
        });
        let mut response = json_response(self.status, &body);
        let query_error = format!("{};Sender", self.code);
        if let Ok(value) = query_error.parse() {
            response.headers_mut().insert("x-amzn-query-error", value);
        }
        response
    }
}

/// What a client sent, as an error quotes it: at most 64 characters (a refusal is no echo
/// of a whole request).
fn shown(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The SQS face of one node. Its keys are the node's (beside its logins).
pub struct Sqs {
    node: Arc<Node>,
    /// The queue's name in its URL (`/NAME`): the queue id, or `queue` on a lone node.
    queue_name: String,
    /// Served over TLS (URLs are `https://`).
    tls: bool,
    /// When the last `PurgeQueue` began.
    last_purge: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Sqs {
    pub fn new(node: Arc<Node>, queue_name: String, tls: bool) -> Arc<Sqs> {
        Arc::new(Sqs {
            node,
            queue_name,
            tls,
            last_purge: std::sync::Mutex::new(None),
        })
    }

    /// Accepts connections on `listener` for the life of the process, at most
    /// [`MAX_CONNECTIONS`] at once (one past it is closed at once: the WebSocket port's
    /// `max-tasks` does not count these).
    pub async fn run(self: Arc<Sqs>, listener: TcpListener, tls: Option<TlsAcceptor>) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok((tcp, _peer)) = listener.accept().await else {
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(tcp);
                continue;
            };
            let (sqs, tls) = (self.clone(), tls.clone());
            tokio::spawn(async move {
                sqs.serve(tcp, tls).await;
                drop(slot);
            });
        }
    }

    /// One connection: HTTP/1.1 requests, kept alive, its bytes counted as the WebSocket
    /// port's are (usage records bill both).
    async fn serve(self: Arc<Sqs>, tcp: tokio::net::TcpStream, tls: Option<TlsAcceptor>) {
        let _ = tcp.set_nodelay(true);
        let (counted, _writes) = Counted::new(tcp, self.node.traffic.clone());
        let service = service_fn(|request: Request<Incoming>| {
            let sqs = self.clone();
            async move { Ok::<_, Infallible>(sqs.answer(request).await) }
        });
        let builder = http1::Builder::new();
        match tls {
            None => {
                let _ = builder
                    .serve_connection(TokioIo::new(counted), service)
                    .await;
            }
            Some(acceptor) => {
                let handshake = tokio::time::timeout(HANDSHAKE_TIME, acceptor.accept(counted));
                if let Ok(Ok(stream)) = handshake.await {
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            }
        }
    }

    /// The answer in the protocol the request speaks (its errors too).
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let query = query::is_query(request.headers());
        let outcome = self.read_and_handle(request, query).await;
        if let Err(error) = &outcome {
            tracing::debug!(code = error.code, message = %error.message, "an SQS request was refused");
        }
        let request_id = query::request_id();
        let mut response = match (query, outcome) {
            (false, Ok((_, answer))) => json_response(StatusCode::OK, &answer),
            (false, Err(error)) => error.response(),
            (true, Ok((action, answer))) => {
                let reply = query::reply(action.name(), &answer, &request_id);
                xml_response(StatusCode::OK, reply)
            }
            (true, Err(error)) => xml_response(error.status, query::error(&error, &request_id)),
        };
        let id =
            hyper::header::HeaderValue::from_str(&request_id).expect("a UUID is a header value");
        response.headers_mut().insert("x-amzn-requestid", id);
        response
    }

    /// The action a request asks for, and its answer.
    async fn read_and_handle(
        &self,
        request: Request<Incoming>,
        query: bool,
    ) -> Result<(actions::Action, Value), SqsError> {
        let (parts, body) = request.into_parts();
        // Nothing is read for a caller that could not be let in: a signature by a key of
        // this queue, made about now. (Whether it is right needs the body.)
        self.admissible(&parts.headers)?;
        let limit = self.body_limit();
        let body = Limited::new(body, limit)
            .collect()
            .await
            .map_err(|_| SqsError::too_big())?
            .to_bytes();
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
            .collect();
        let signed = sigv4::Signed {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or(""),
            headers: &headers,
            body: &body,
        };
        let key = self.authenticate(&signed)?;
        let (action, mut input) = match query {
            false => json_request(header(&headers, "x-amz-target"), &body)?,
            true => query_request(&body)?,
        };
        if !action.allowed_for(key.role) {
            return Err(SqsError::access_denied(action.name(), key.role));
        }
        let scheme = if self.tls { "https" } else { "http" };
        let host = header(&headers, "host").unwrap_or("localhost");
        // Older SDKs post to the queue's URL and may leave the parameter out.
        if query && input.get("QueueUrl").is_none() && parts.uri.path() != "/" {
            let url = format!("{scheme}://{host}{}", parts.uri.path());
            input["QueueUrl"] = Value::String(url);
        }
        let queue_url = format!("{scheme}://{host}/{}", self.queue_name);
        let context = actions::Context {
            node: &self.node,
            queue_name: &self.queue_name,
            queue_url: &queue_url,
            last_purge: &self.last_purge,
        };
        let answer = actions::run(action, &context, &input).await?;
        Ok((action, answer))
    }

    /// Whether a request's headers name one of this queue's keys and a time within the skew.
    fn admissible(&self, headers: &hyper::HeaderMap) -> Result<(), SqsError> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let authorization =
            text("authorization").ok_or(SqsError::signature(sigv4::Refused::Missing))?;
        let authorization =
            sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
        if self.node.sqs_key(authorization.access_key_id).is_none() {
            return Err(SqsError::signature(sigv4::Refused::UnknownKey));
        }
        let now = crate::engine::now_ms() / 1000;
        sigv4::check_time(text("x-amz-date"), now).map_err(SqsError::signature)
    }

    /// The request's key, if its signature is right.
    fn authenticate(&self, signed: &sigv4::Signed<'_>) -> Result<SqsKey, SqsError> {
        let authorization = header(signed.headers, "authorization")
            .ok_or(SqsError::signature(sigv4::Refused::Missing))?;
        let authorization =
            sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
        let key = self
            .node
            .sqs_key(authorization.access_key_id)
            .ok_or(SqsError::signature(sigv4::Refused::UnknownKey))?;
        let now = crate::engine::now_ms() / 1000;
        sigv4::verify(signed, &authorization, &key.secret, now).map_err(SqsError::signature)?;
        Ok(key)
    }

    /// The longest request body read: ten messages of the largest size, and their JSON.
    fn body_limit(&self) -> usize {
        let largest = self.node.setting(Setting::MaxWsMsgLen) as usize;
        10 * 2 * largest + (64 << 10)
    }
}

/// The JSON protocol's request: the action its target names, and its body (an object).
fn json_request(target: Option<&str>, body: &[u8]) -> Result<(actions::Action, Value), SqsError> {
    let target = target.unwrap_or_default();
    let action = target
        .strip_prefix("AmazonSQS.")
        .and_then(actions::Action::parse)
        .ok_or_else(|| SqsError::unknown_operation(target))?;
    let input: Value = match body.is_empty() {
        true => Value::Object(Default::default()),
        false => serde_json::from_slice(body).map_err(|_| SqsError::not_json())?,
    };
    match input.is_object() {
        true => Ok((action, input)),
        false => Err(SqsError::not_json()),
    }
}

/// The query protocol's request: the action its `Action` names, and its parameters in the
/// JSON protocol's shape.
fn query_request(body: &[u8]) -> Result<(actions::Action, Value), SqsError> {
    let (name, input) = query::input(body)?;
    let action = actions::Action::parse(&name).ok_or_else(|| SqsError::unknown_operation(&name))?;
    Ok((action, input))
}

/// The most SQS connections served at once.
pub const MAX_CONNECTIONS: usize = 512;

/// How long a client has for its TLS handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(10);

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    response
}

fn xml_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/xml"),
    );
    response
}

/// Listens for the SQS face on `addr`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
