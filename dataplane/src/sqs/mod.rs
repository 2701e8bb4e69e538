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
pub use actions::ReceiptKey;
mod attributes;
pub mod dead_letters;
mod move_tasks;
mod replies;

pub use qe_shared::sqs::{query, sigv4, SqsError};

use crate::auth::SqsKey;
use crate::control_plane::ReportTo;
use crate::state::Node;
use crate::traffic::Counted;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use qe_shared::settings::Setting;
use serde_json::Value;
use sigv4::header;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// What an action runs with.
pub struct Context<'a> {
    pub node: &'a Arc<Node>,
    pub queue_name: &'a str,
    /// The scheme and host (`HOST[:PORT]`) this request's client reaches the queue at: its
    /// URL as that client knows it ([`Context::queue_url`]).
    pub scheme: &'a str,
    pub host: &'a str,
    /// When the last `PurgeQueue` began (SQS takes one a minute).
    pub last_purge: &'a std::sync::Mutex<Option<std::time::Instant>>,
    /// The last message move tasks.
    pub move_tasks: &'a std::sync::Mutex<move_tasks::MoveTasks>,
    /// The access key id the request was signed with: the `SenderId` of what it sends.
    pub sender: &'a str,
    /// The node's channel to its control plane, which keeps the queue's redrive; None on a
    /// node without one.
    pub channel: Option<&'a crate::control_plane::channel::Channel>,
    /// What receipt handles are signed with.
    pub receipt_key: &'a ReceiptKey,
}

impl Context<'_> {
    /// The queue's URL as this request's client reaches it (made only for the actions that
    /// answer with it).
    pub fn queue_url(&self) -> String {
        format!("{}://{}/{}", self.scheme, self.host, self.queue_name)
    }
}

/// `error` as AWS's JSON protocol sends it.
fn error_response(error: &SqsError) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST);
    let body = serde_json::to_vec(&error.json_body()).expect("a JSON value serializes");
    let mut response = json_response(status, body);
    if let Ok(value) = error.query_error_header().parse() {
        response.headers_mut().insert("x-amzn-query-error", value);
    }
    response
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
    /// The node's control plane, which serves its account's actions (`CreateQueue`,
    /// `TagQueue`, ...): an SDK that sends every action with a queue URL to the URL's host
    /// (the JavaScript SDK's default) sends them here, and they are handed on as signed.
    control_plane: Option<(ReportTo, reqwest::Client)>,
    /// The node's channel: a change to the queue's redrive is the control plane's to make.
    channel: Option<crate::control_plane::channel::Channel>,
    /// What receipt handles are signed with.
    receipt_key: actions::ReceiptKey,
    /// The last message move tasks (ListMessageMoveTasks).
    move_tasks: std::sync::Mutex<move_tasks::MoveTasks>,
    /// The day's SigV4 signing key of each access key that signed lately.
    signing_keys: sigv4::SigningKeys,
}

/// The actions an account's endpoint (the control plane) serves that name a queue by its URL.
const ACCOUNT_ACTIONS: [&str; 5] = [
    "DeleteQueue",
    "TagQueue",
    "UntagQueue",
    "ListQueueTags",
    "ListDeadLetterSourceQueues",
];

/// What a request gets: an answer made here (the JSON protocol's body), or the control
/// plane's.
enum Outcome {
    Answered(actions::Action, Vec<u8>),
    HandedOn(Response<Full<Bytes>>),
}

impl Sqs {
    pub fn new(
        node: Arc<Node>,
        queue_name: String,
        tls: bool,
        control_plane: Option<ReportTo>,
        channel: Option<crate::control_plane::channel::Channel>,
        receipt_key: actions::ReceiptKey,
    ) -> Arc<Sqs> {
        let control_plane = control_plane.map(|to| {
            let client = crate::control_plane::client(&to, HAND_ON_WITHIN);
            (to, client)
        });
        Arc::new(Sqs {
            node,
            queue_name,
            tls,
            last_purge: std::sync::Mutex::new(None),
            control_plane,
            channel,
            receipt_key,
            move_tasks: Default::default(),
            signing_keys: Default::default(),
        })
    }

    /// Accepts connections on `listener` for the life of the process, within `limits`
    /// (`qe_serve`: the connections at once in all and per source, the head and idle time,
    /// the body bytes read at once; the WebSocket port's `max-tasks` does not count these).
    pub async fn run(
        self: Arc<Sqs>,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        limits: qe_serve::Limits,
    ) {
        let gate = qe_serve::Gate::new(limits);
        let _near = qe_serve::NearTimer::start();
        loop {
            let (tcp, _peer, place) = qe_serve::accept(&gate, &listener).await;
            let (sqs, tls, gate) = (self.clone(), tls.clone(), gate.clone());
            tokio::spawn(async move {
                sqs.serve(tcp, tls, gate).await;
                drop(place);
            });
        }
    }

    /// One connection: HTTP/1.1 requests, kept alive, its bytes counted as the WebSocket
    /// port's are (usage records bill both).
    async fn serve(
        self: Arc<Sqs>,
        tcp: tokio::net::TcpStream,
        tls: Option<TlsAcceptor>,
        gate: Arc<qe_serve::Gate>,
    ) {
        let _ = tcp.set_nodelay(true);
        let (counted, _writes) = Counted::new(tcp, self.node.traffic.clone());
        let service = service_fn(|request: Request<Incoming>| {
            let (sqs, gate) = (self.clone(), gate.clone());
            async move { Ok::<_, Infallible>(sqs.answer(request, &gate).await) }
        });
        let builder = qe_serve::http1(gate.limits());
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
    /// One whose body was not read (refused before it was) closes the connection after it.
    async fn answer(
        &self,
        request: Request<Incoming>,
        gate: &qe_serve::Gate,
    ) -> Response<Full<Bytes>> {
        let (request, body_read) = qe_serve::track_body(request);
        let mut response = self.answer_tracked(request, gate).await;
        qe_serve::close_unless_read(&mut response, &body_read);
        response
    }

    async fn answer_tracked(
        &self,
        request: Request<qe_serve::TrackedBody<Incoming>>,
        gate: &qe_serve::Gate,
    ) -> Response<Full<Bytes>> {
        let query = is_query(request.headers());
        let outcome = self.read_and_handle(request, query, gate).await;
        if let Err(error) = &outcome {
            tracing::debug!(code = error.code, message = %error.message, "an SQS request was refused");
        }
        let request_id = qe_shared::sqs::request_id();
        let mut response = match (query, outcome) {
            (_, Ok(Outcome::HandedOn(response))) => return response,
            (false, Ok(Outcome::Answered(_, answer))) => json_response(StatusCode::OK, answer),
            (false, Err(error)) => error_response(&error),
            (true, Ok(Outcome::Answered(action, answer))) => {
                // The query protocol's XML is made from the JSON protocol's answer.
                let answer: Value = serde_json::from_slice(&answer).expect("an answer is JSON");
                let reply = query::reply(action.name(), &answer, &request_id);
                xml_response(StatusCode::OK, reply)
            }
            (true, Err(error)) => {
                let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST);
                xml_response(status, query::error(&error, &request_id))
            }
        };
        let id =
            hyper::header::HeaderValue::from_str(&request_id).expect("a UUID is a header value");
        response.headers_mut().insert("x-amzn-requestid", id);
        response
    }

    /// The action a request asks for, and its answer.
    async fn read_and_handle(
        &self,
        request: Request<qe_serve::TrackedBody<Incoming>>,
        query: bool,
        gate: &qe_serve::Gate,
    ) -> Result<Outcome, SqsError> {
        let (parts, body) = request.into_parts();
        // Nothing is read for a caller that could not be let in: a signature by a key of
        // this queue, made about now. (Whether it is right needs the body.)
        self.admissible(&parts.headers)?;
        let limit = self.body_limit();
        // Room in the port's budget of body bytes first (waiting while others read theirs),
        // then the body, within its time.
        let declared = hyper::body::Body::size_hint(&body)
            .upper()
            .map_or(limit, |upper| upper as usize);
        let room = gate.body_room(declared.min(limit)).await;
        let reading = Limited::new(body, limit).collect();
        let body = tokio::time::timeout(gate.limits().body_within(), reading)
            .await
            .map_err(|_| SqsError::incomplete_body())?
            .map_err(|_| SqsError::too_big())?
            .to_bytes();
        // Read: the room is for bodies being read, not for the answer (a long poll's 20 s).
        drop(room);
        let pairs = parts.headers.iter();
        let headers =
            sigv4::text_headers(pairs.map(|(name, value)| (name.as_str(), value.as_bytes())));
        let signed = sigv4::Signed {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or(""),
            headers: &headers,
            body: &body,
        };
        let key = self.authenticate(&signed)?;
        if let Some(control_plane) = &self.control_plane {
            let name = match query {
                false => header(&headers, "x-amz-target")
                    .and_then(|target| target.strip_prefix("AmazonSQS."))
                    .map(str::to_string),
                true => query::input(&body).ok().map(|(name, _)| name),
            };
            if name.is_some_and(|name| ACCOUNT_ACTIONS.contains(&name.as_str())) {
                let handed_on = hand_on(control_plane, &parts, body).await?;
                return Ok(Outcome::HandedOn(handed_on));
            }
        }
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
        let context = Context {
            node: &self.node,
            queue_name: &self.queue_name,
            scheme,
            host,
            last_purge: &self.last_purge,
            move_tasks: &self.move_tasks,
            sender: &key.access_key_id,
            channel: self.channel.as_ref(),
            receipt_key: &self.receipt_key,
        };
        let answer = actions::run(action, &context, &input).await?;
        Ok(Outcome::Answered(action, answer))
    }

    /// Whether a request's headers name one of this queue's keys and a time within the skew.
    fn admissible(&self, headers: &hyper::HeaderMap) -> Result<(), SqsError> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let authorization =
            text("authorization").ok_or_else(|| SqsError::signature(sigv4::Refused::Missing))?;
        let authorization =
            sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
        if self.node.sqs_key(authorization.access_key_id).is_none() {
            return Err(SqsError::signature(sigv4::Refused::UnknownKey));
        }
        let now = crate::engine::now_ms() / 1000;
        sigv4::check_time(text("x-amz-date"), now).map_err(SqsError::signature)
    }

    /// The request's key, if its signature is right.
    fn authenticate(&self, signed: &sigv4::Signed<'_>) -> Result<Arc<SqsKey>, SqsError> {
        let authorization = header(signed.headers, "authorization")
            .ok_or_else(|| SqsError::signature(sigv4::Refused::Missing))?;
        let authorization =
            sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
        let key = self
            .node
            .sqs_key(authorization.access_key_id)
            .ok_or_else(|| SqsError::signature(sigv4::Refused::UnknownKey))?;
        let now = crate::engine::now_ms() / 1000;
        sigv4::verify_with(signed, &authorization, &key.secret, now, &self.signing_keys)
            .map_err(SqsError::signature)?;
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

/// For the fuzz targets: reads a request body as the face does (a form of the query
/// protocol, or JSON naming its action in `target`), then what its action reads of it before
/// touching the queue; the action's name, or the refusal.
#[doc(hidden)]
pub fn read_request_for_fuzzing(
    query: bool,
    target: Option<&str>,
    body: &[u8],
) -> Result<&'static str, SqsError> {
    let (action, input) = match query {
        true => query_request(body)?,
        false => json_request(target, body)?,
    };
    actions::read_input_for_fuzzing(&input);
    Ok(action.name())
}

/// The query protocol's request: the action its `Action` names, and its parameters in the
/// JSON protocol's shape.
fn query_request(body: &[u8]) -> Result<(actions::Action, Value), SqsError> {
    let (name, input) = query::input(body)?;
    let action = actions::Action::parse(&name).ok_or_else(|| SqsError::unknown_operation(&name))?;
    Ok((action, input))
}

/// Hands a request on to the control plane as it came (its signature, made for this host,
/// is checked there with the same key), and its reply back.
async fn hand_on(
    (to, client): &(ReportTo, reqwest::Client),
    parts: &hyper::http::request::Parts,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, SqsError> {
    let unreachable =
        || SqsError::unavailable("The control plane cannot be reached now. Try again.");
    let request = |base: &str| {
        let url = format!("{}/", base.trim_end_matches('/'));
        let mut request = client.post(url).body(body.clone());
        for (name, value) in &parts.headers {
            if !HOP_BY_HOP.contains(&name.as_str()) {
                request = request.header(name.as_str(), value.as_bytes());
            }
        }
        request
    };
    // To the replica the node's channel uses now, failing over as the channel does; every
    // reply (an SQS refusal too) goes back as it is.
    let reply = to
        .control_planes
        .call(|base| {
            let sent = request(&base).send();
            async move {
                sent.await
                    .map_err(crate::control_plane::replicas::Unanswered::from)
            }
        })
        .await
        .map_err(|_| unreachable())?;
    let status = StatusCode::from_u16(reply.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut headers = hyper::HeaderMap::new();
    for name in ["content-type", "x-amzn-requestid", "x-amzn-query-error"] {
        if let Some(value) = reply.headers().get(name).and_then(|v| v.to_str().ok()) {
            if let Ok(value) = hyper::header::HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        }
    }
    let body = reply.bytes().await.map_err(|_| unreachable())?;
    let mut response = Response::new(Full::new(Bytes::from(body.to_vec())));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

/// Headers of one connection, not of the request: not handed on.
const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
];

/// How long the control plane has to answer an action handed on to it.
const HAND_ON_WITHIN: Duration = Duration::from_secs(30);

/// How long a client has for its TLS handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(10);

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
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

/// Whether a request speaks the query protocol: a form, without the JSON protocol's target.
fn is_query(headers: &hyper::HeaderMap) -> bool {
    let content_type = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    query::is_query(content_type, headers.contains_key("x-amz-target"))
}
