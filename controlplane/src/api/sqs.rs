//! The control plane's SQS endpoint (docs/sqs.md, *The account's endpoint*): what an
//! application written for Amazon SQS calls at start-up — `CreateQueue`, `GetQueueUrl`,
//! `ListQueues`, `DeleteQueue`, the tags — on the API's own port (`POST /`), signed (SigV4)
//! with one of its account's SQS keys (`api/accounts.rs`).
//!
//! A request's path: [`serve`] checks that its headers name a key of an account and a time
//! within the skew before it reads the body, checks the signature with the key's derived
//! secret, then runs an account's action here, or hands a queue's action (a send, a receive
//! ...) on to the queue's node as it came ([`forward`]): its signature is the client's, and
//! the node knows the account's keys (they are in every config of the account's queues), so
//! an SDK that keeps this endpoint for every call works unchanged.

use crate::api::{ApiError, AppState};
use crate::model::account::{self, Account};
use crate::model::audit::{Actor, Entry, Target};
use crate::model::queue::{self, NewQueue, Queue};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use qe_shared::protocol::Role;
use qe_shared::sqs::{query, sigv4, SqsError};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The endpoint's URL as clients reach it (the control plane's start fills it in from the
/// API's own address when the config does not give it).
pub fn endpoint(config: &crate::config::Config) -> Option<String> {
    let endpoint = config.sqs.endpoint.as_deref()?;
    Some(endpoint.trim_end_matches('/').to_string())
}

/// The largest request body read: a batch of ten messages of 1 MiB, and their JSON.
const BODY_AT_MOST: usize = 22 << 20;

/// How long a request's body may take to arrive.
const BODY_WITHIN: Duration = Duration::from_secs(30);

/// How long `CreateQueue` waits for a new queue's node to serve (its URL names the node).
const PLACED_WITHIN: Duration = Duration::from_secs(20);

/// The actions served here; every other action of SQS's a queue's node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    CreateQueue,
    DeleteQueue,
    GetQueueUrl,
    ListQueues,
    TagQueue,
    UntagQueue,
    ListQueueTags,
    ListDeadLetterSourceQueues,
}

impl Action {
    fn parse(name: &str) -> Option<Action> {
        Some(match name {
            "CreateQueue" => Action::CreateQueue,
            "DeleteQueue" => Action::DeleteQueue,
            "GetQueueUrl" => Action::GetQueueUrl,
            "ListQueues" => Action::ListQueues,
            "TagQueue" => Action::TagQueue,
            "UntagQueue" => Action::UntagQueue,
            "ListQueueTags" => Action::ListQueueTags,
            "ListDeadLetterSourceQueues" => Action::ListDeadLetterSourceQueues,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::CreateQueue => "CreateQueue",
            Action::DeleteQueue => "DeleteQueue",
            Action::GetQueueUrl => "GetQueueUrl",
            Action::ListQueues => "ListQueues",
            Action::TagQueue => "TagQueue",
            Action::UntagQueue => "UntagQueue",
            Action::ListQueueTags => "ListQueueTags",
            Action::ListDeadLetterSourceQueues => "ListDeadLetterSourceQueues",
        }
    }

    /// The changes: an admin key's alone, and audited.
    fn changes(self) -> bool {
        matches!(
            self,
            Action::CreateQueue | Action::DeleteQueue | Action::TagQueue | Action::UntagQueue
        )
    }
}

/// The queue actions a node serves, handed on to it.
const NODE_ACTIONS: [&str; 13] = [
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "GetQueueAttributes",
    "SetQueueAttributes",
    "PurgeQueue",
    // Named by the dead letter queue's ARN, or the task's handle.
    "StartMessageMoveTask",
    "ListMessageMoveTasks",
    "CancelMessageMoveTask",
];

/// The key a request was signed with.
struct Signer {
    account: Account,
    access_key_id: String,
    role: Role,
    /// The region it signed for: where `CreateQueue` makes the queue.
    region: String,
}

/// What a request gets: an answer made here, or the node's own reply.
enum Answer {
    Made(Action, Value),
    Forwarded(Response),
}

/// `POST /`: one SQS request, in the JSON protocol or the query protocol.
pub async fn serve(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let request_id = qe_shared::sqs::request_id();
    let headers = request.headers();
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let query = query::is_query(content_type, headers.contains_key("x-amz-target"));
    let outcome = handle(&state, request, query).await;
    let mut response = match (query, outcome) {
        (_, Ok(Answer::Forwarded(response))) => return response,
        (false, Ok(Answer::Made(_, answer))) => json_reply(StatusCode::OK, answer.to_string()),
        (true, Ok(Answer::Made(action, answer))) => xml_reply(
            StatusCode::OK,
            query::reply(action.name(), &answer, &request_id),
        ),
        (false, Err(error)) => {
            let mut response = json_reply(status_of(&error), error.json_body().to_string());
            if let Ok(value) = HeaderValue::from_str(&error.query_error_header()) {
                response.headers_mut().insert("x-amzn-query-error", value);
            }
            response
        }
        (true, Err(error)) => xml_reply(status_of(&error), query::error(&error, &request_id)),
    };
    let id = HeaderValue::from_str(&request_id).expect("a UUID is a header value");
    response.headers_mut().insert("x-amzn-requestid", id);
    response
}

fn status_of(error: &SqsError) -> StatusCode {
    StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST)
}

fn json_reply(status: StatusCode, body: String) -> Response {
    let content_type = [(
        axum::http::header::CONTENT_TYPE,
        "application/x-amz-json-1.0",
    )];
    (status, content_type, body).into_response()
}

fn xml_reply(status: StatusCode, body: String) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "text/xml")],
        body,
    )
        .into_response()
}

async fn handle(state: &AppState, request: Request, query: bool) -> Result<Answer, SqsError> {
    let (parts, body) = request.into_parts();
    // Nothing is read for a caller that could not be let in: a key of an account, a time
    // about now. (Whether the signature is right needs the body.)
    let (account, access_key_id, role) = admissible(state, &parts.headers).await?;
    // In time too: a caller who names a key id (not a secret) must not hold a connection
    // and its buffer open by trickling a body.
    let read = axum::body::to_bytes(body, BODY_AT_MOST);
    let body = tokio::time::timeout(BODY_WITHIN, read)
        .await
        .map_err(|_| {
            let message = "The request body did not arrive within 30 s.";
            SqsError::batch("RequestTimeout", "RequestTimeout", message)
        })?
        .map_err(|_| SqsError::too_big())?;
    let pairs = parts.headers.iter();
    let headers = sigv4::text_headers(pairs.map(|(name, value)| (name.as_str(), value.as_bytes())));
    let signed = sigv4::Signed {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        headers: &headers,
        body: &body,
    };
    let authorization = sigv4::header(&headers, "authorization").unwrap_or_default();
    let authorization = sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
    let secret = state
        .node_tokens
        .account_sqs_secret(&account.id, &access_key_id);
    let keys = &state.sqs_signing_keys;
    sigv4::verify_with(&signed, &authorization, &secret, crate::unix_now(), keys)
        .map_err(SqsError::signature)?;
    let signer = Signer {
        region: authorization.region.to_string(),
        account,
        access_key_id,
        role,
    };
    let (name, input) = match query {
        false => json_input(sigv4::header(&headers, "x-amz-target"), &body)?,
        true => query::input(&body)?,
    };
    let Some(action) = Action::parse(&name) else {
        if !NODE_ACTIONS.contains(&name.as_str()) {
            return Err(SqsError::unknown_operation(&name));
        }
        let queue = queue_at(state, &signer.account, &input).await?;
        return forward(state, &queue, parts, body)
            .await
            .map(Answer::Forwarded);
    };
    if action.changes() && signer.role != Role::Admin {
        return Err(SqsError::access_denied(action.name(), signer.role));
    }
    let (answer, target) = run(state, &signer, action, &input).await?;
    if action.changes() {
        let actor = Actor::Account {
            account: signer.account.id.clone(),
            key: signer.access_key_id.clone(),
        };
        let target = Target {
            id: target,
            account: Some(signer.account.id.clone()),
        };
        let action_name = format!("sqs.{}", action.name());
        state
            .store
            .record_audit(Entry::new(actor, &action_name, target, 200))
            .await;
    }
    Ok(Answer::Made(action, answer))
}

/// The account and role of the key a request's headers name, if it is one not revoked and
/// the request's time is within the skew.
async fn admissible(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<(Account, String, Role), SqsError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let unknown = || SqsError::signature(sigv4::Refused::UnknownKey);
    let authorization =
        text("authorization").ok_or_else(|| SqsError::signature(sigv4::Refused::Missing))?;
    let authorization = sigv4::parse_authorization(authorization).map_err(SqsError::signature)?;
    sigv4::check_time(text("x-amz-date"), crate::unix_now()).map_err(SqsError::signature)?;
    let key_id = authorization.access_key_id;
    let account_id = account::account_of_sqs_key(key_id).ok_or_else(unknown)?;
    let account = state
        .store
        .account(&account_id)
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?
        .ok_or_else(unknown)?;
    let key = account
        .sqs_keys
        .iter()
        .find(|key| key.access_key_id == key_id && !key.revoked)
        .ok_or_else(unknown)?;
    let role = Role::parse(&key.role).ok_or_else(unknown)?;
    Ok((account.clone(), key_id.to_string(), role))
}

/// The JSON protocol's request: the action its target names, and its body (an object).
fn json_input(target: Option<&str>, body: &[u8]) -> Result<(String, Value), SqsError> {
    let target = target.unwrap_or_default();
    let name = target
        .strip_prefix("AmazonSQS.")
        .ok_or_else(|| SqsError::unknown_operation(target))?;
    let input: Value = match body.is_empty() {
        true => Value::Object(Map::new()),
        false => serde_json::from_slice(body).map_err(|_| SqsError::not_json())?,
    };
    match input.is_object() {
        true => Ok((name.to_string(), input)),
        false => Err(SqsError::not_json()),
    }
}

/// Runs an account's action; its answer, and what it was done to (for the audit).
async fn run(
    state: &AppState,
    signer: &Signer,
    action: Action,
    input: &Value,
) -> Result<(Value, String), SqsError> {
    let account = &signer.account;
    match action {
        Action::CreateQueue => create_queue(state, signer, input).await,
        Action::GetQueueUrl => {
            let name = text(input, "QueueName")?;
            let queue = super::redrive::live_queue_named(state, account, name)
                .await?
                .ok_or_else(SqsError::queue_does_not_exist)?;
            Ok((json!({ "QueueUrl": queue_url(state, &queue)? }), queue.id))
        }
        Action::ListQueues => Ok((list_queues(state, account, input).await?, String::new())),
        Action::DeleteQueue => {
            let queue = queue_at(state, account, input).await?;
            super::queue_operations::mark_deleting(state, &queue.id)
                .await
                .map_err(unavailable)?;
            Ok((json!({}), queue.id))
        }
        Action::TagQueue => {
            let queue = queue_at(state, account, input).await?;
            let tags = string_map(&input["Tags"], "Tags")?;
            let tagged = change_tags(state, &queue, |held| held.extend(tags.clone())).await?;
            Ok((json!({}), tagged.id))
        }
        Action::UntagQueue => {
            let queue = queue_at(state, account, input).await?;
            let keys: Vec<String> = match &input["TagKeys"] {
                Value::Array(keys) => keys
                    .iter()
                    .filter_map(|key| key.as_str().map(str::to_string))
                    .collect(),
                _ => return Err(SqsError::missing_parameter("TagKeys")),
            };
            let untagged = change_tags(state, &queue, |held| {
                held.retain(|key, _| !keys.contains(key));
            })
            .await?;
            Ok((json!({}), untagged.id))
        }
        Action::ListQueueTags => {
            let queue = queue_at(state, account, input).await?;
            Ok((json!({ "Tags": queue.tags }), queue.id))
        }
        Action::ListDeadLetterSourceQueues => {
            let queue = queue_at(state, account, input).await?;
            let sources = super::redrive::sources(state, &queue).await?;
            let urls: Result<Vec<String>, SqsError> = sources
                .iter()
                .map(|source| queue_url(state, source))
                .collect();
            Ok((json!({ "queueUrls": urls? }), queue.id))
        }
    }
}

/// `CreateQueue`: provisions a queue of the account (its attributes set on its node, its
/// tags kept), or, for a name the account has, the same URL when the attributes are the
/// same and `QueueAlreadyExists` when they are not, as AWS does.
async fn create_queue(
    state: &AppState,
    signer: &Signer,
    input: &Value,
) -> Result<(Value, String), SqsError> {
    let name = text(input, "QueueName")?;
    queue::check_name(name).map_err(SqsError::invalid_parameter)?;
    let attributes = match &input["Attributes"] {
        Value::Null => BTreeMap::new(),
        given => string_map(given, "Attributes")?,
    };
    // The JSON protocol names the map `tags`; the query protocol's `Tag.N` reads as `Tags`.
    let tags = match (&input["tags"], &input["Tags"]) {
        (Value::Null, Value::Null) => BTreeMap::new(),
        (Value::Null, given) | (given, _) => string_map(given, "tags")?,
    };
    queue::check_tags(&tags).map_err(SqsError::invalid_parameter)?;
    // A FIFO queue has both the `.fifo` name and `FifoQueue` true, as on AWS.
    let fifo = attributes.get("FifoQueue").is_some_and(|v| v == "true");
    if fifo != name.ends_with(".fifo") {
        return Err(SqsError::invalid_parameter(
            "A FIFO queue's name ends with .fifo and it has FifoQueue true; a standard queue has neither.",
        ));
    }
    if !fifo && attributes.contains_key("ContentBasedDeduplication") {
        return Err(SqsError::batch(
            "InvalidAttributeName",
            "InvalidAttributeName",
            "Unknown Attribute ContentBasedDeduplication.",
        ));
    }
    // (`FifoQueue=false` is what every queue here is: nothing to set.)
    let as_object: Map<String, Value> = attributes
        .iter()
        .filter(|(name, value)| !(name.as_str() == "FifoQueue" && value.as_str() == "false"))
        .map(|(name, value)| (name.clone(), Value::String(value.clone())))
        .collect();
    let mut initial: BTreeMap<String, u64> = qe_shared::sqs::settings_of(&as_object, true)?
        .into_iter()
        .map(|(setting, value)| (setting.name().to_string(), value))
        .collect();
    // Dead letters sent to another queue of the account: checked before anything is made.
    let redrive = qe_shared::node_channel::RedriveChange {
        dead_letter_target_arn: attributes
            .get("RedrivePolicy")
            .and_then(|policy| qe_shared::sqs::dead_letter_target_arn(policy)),
        allow_policy: attributes.get("RedriveAllowPolicy").cloned(),
    };
    if let Some(arn) = &redrive.dead_letter_target_arn {
        let account = Some(signer.account.id.as_str());
        super::redrive::resolve_target(state, account, &[name], fifo, arn).await?;
    }
    // AWS's default message size, where the manual's WebSocket default is 64 KiB.
    initial
        .entry(qe_shared::settings::Setting::MaxWsMsgLen.name().to_string())
        .or_insert(SQS_DEFAULT_MESSAGE_SIZE);
    for attempt in 0..2 {
        // The account as it is now: a create of the same name a moment ago holds it.
        let account = state
            .store
            .account(&signer.account.id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| SqsError::signature(sigv4::Refused::UnknownKey))?;
        if let Some(queue) = being_made(state, &account, name).await? {
            if queue.sqs_attributes != attributes {
                return Err(SqsError::queue_already_exists(name));
            }
            let queue = placed(state, &queue).await?;
            return Ok((json!({ "QueueUrl": queue_url(state, &queue)? }), queue.id));
        }
        let config = &state.config.sqs;
        let tiers = &signer.account.limits.tiers;
        let tier = match tiers.contains(&config.tier) {
            true => config.tier,
            false => tiers.first().copied().unwrap_or(config.tier),
        };
        let new = NewQueue {
            tier,
            region: signer.region.clone(),
            instance_type: config.instance_type.clone(),
            ipv4: config.ipv4,
            account: Some(signer.account.id.clone()),
            name: Some(name.to_string()),
            tags: tags.clone(),
            sqs_attributes: attributes.clone(),
            initial_settings: initial.clone(),
            // SQS's CreateQueue has no such attribute: one node, as for every queue by default.
            replicas: None,
        };
        match super::queue_operations::provision(state, new).await {
            Ok((queue, _logins)) => {
                let queue = match redrive != Default::default() {
                    true => super::redrive::change(state, &queue, &redrive).await?,
                    false => queue,
                };
                super::queue_operations::refresh_zone(state)
                    .await
                    .map_err(|e| SqsError::unavailable(&e.to_string()))?;
                let queue = placed(state, &queue).await?;
                return Ok((json!({ "QueueUrl": queue_url(state, &queue)? }), queue.id));
            }
            // Made at the same moment by another request: answered as that one.
            Err(ApiError::Conflict(_)) if attempt == 0 => continue,
            Err(ApiError::LimitReached(message)) => return Err(SqsError::over_limit(&message)),
            Err(ApiError::BadRequest(message)) => return Err(SqsError::invalid_parameter(message)),
            Err(error) => return Err(unavailable(error)),
        }
    }
    Err(SqsError::queue_already_exists(name))
}

/// A queue made through SQS holds messages up to AWS's default size, 256 KiB.
const SQS_DEFAULT_MESSAGE_SIZE: u64 = 256 * 1024;

/// `queue` once its node serves it with its attributes, waiting up to [`PLACED_WITHIN`], so
/// that the first send to the URL finds it so; one placed but not serving by then is
/// answered too (its URL names the node, and SDKs retry the `ServiceUnavailable` a send
/// gets until it serves). A queue not placed by then is `ServiceUnavailable`, which SDKs
/// retry (CreateQueue is idempotent).
async fn placed(state: &AppState, queue: &Queue) -> Result<Queue, SqsError> {
    if queue.settled() {
        return Ok(queue.clone());
    }
    let serving = |queue: &Queue| queue.settled() || !queue.status.is_live();
    let waited = state.store.wait_for(&queue.id, PLACED_WITHIN, serving);
    let latest = waited
        .await
        .map_err(|e| SqsError::unavailable(&e.to_string()))?;
    match latest {
        Some(queue) if queue.node.is_some() && queue.status.is_live() => Ok(queue),
        _ => Err(SqsError::unavailable(
            "The queue is being made: its node is not placed yet. Try again.",
        )),
    }
}

/// `ListQueues`: the account's queues whose names start with `QueueNamePrefix`, by name; a
/// page of `MaxResults` (1 to 1000) with a `NextToken` for the rest when asked for.
async fn list_queues(
    state: &AppState,
    account: &Account,
    input: &Value,
) -> Result<Value, SqsError> {
    let prefix = input["QueueNamePrefix"].as_str().unwrap_or("");
    let page = match &input["MaxResults"] {
        Value::Null => None,
        given => Some(
            number(given)
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| {
                    SqsError::invalid_parameter("MaxResults is an integer from 1 to 1000.")
                })? as usize,
        ),
    };
    let after = match input["NextToken"].as_str() {
        Some(token) => Some(read_token(token)?),
        None => None,
    };
    let mut listed = Vec::new();
    for queue in live_queues(state, account).await? {
        let name = queue.sqs_name().to_string();
        let after_token = after.as_ref().is_none_or(|after| &name > after);
        if name.starts_with(prefix) && after_token && queue.node.is_some() {
            listed.push((name, queue));
        }
    }
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let more = page.is_some_and(|page| listed.len() > page);
    if let Some(page) = page {
        listed.truncate(page);
    }
    let urls = listed
        .iter()
        .map(|(_, queue)| queue_url(state, queue))
        .collect::<Result<Vec<String>, SqsError>>()?;
    let mut answer = json!({ "QueueUrls": urls });
    if let (true, Some((last, _))) = (more, listed.last()) {
        answer["NextToken"] = json!(token_of(last));
    }
    Ok(answer)
}

/// A `NextToken`: the last name listed, base64 (a token is opaque to clients).
fn token_of(name: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
}

fn read_token(token: &str) -> Result<String, SqsError> {
    use base64::Engine;
    let bad = || SqsError::invalid_parameter("NextToken is not one ListQueues gave.");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// The account's queues not being deleted.
async fn live_queues(state: &AppState, account: &Account) -> Result<Vec<Queue>, SqsError> {
    let mut live = Vec::new();
    for id in account.queues.keys() {
        let queue = state.store.get(id).await.map_err(store_error)?;
        live.extend(queue.filter(|queue| queue.status.is_live()));
    }
    Ok(live)
}

/// The account's live queue named `name`, waiting a moment for the record of one whose
/// create (at the same moment, on this replica or another) has reserved the name.
async fn being_made(
    state: &AppState,
    account: &Account,
    name: &str,
) -> Result<Option<Queue>, SqsError> {
    if let Some(id) = account.names.get(name) {
        let made = state.store.wait_for_record(id, RECORD_WITHIN);
        made.await.map_err(store_error)?;
    }
    super::redrive::live_queue_named(state, account, name).await
}

/// How long a create waits for the record of a queue whose name another create reserved.
const RECORD_WITHIN: Duration = Duration::from_secs(5);

/// The account's queue a request names: by its `QueueUrl`'s last part (the queue's id, or
/// its name), or, for a message move task, by its dead letter queue's ARN or its handle.
async fn queue_at(state: &AppState, account: &Account, input: &Value) -> Result<Queue, SqsError> {
    let named_by = if let Some(arn) = input["SourceArn"].as_str() {
        qe_shared::sqs::queue_of_dlq_arn(arn)
            .ok_or_else(|| {
                SqsError::resource_not_found("The SourceArn names no dead letter queue.")
            })?
            .to_string()
    } else if let Some(handle) = input["TaskHandle"].as_str() {
        let (queue, _) = qe_shared::sqs::read_move_task_handle(handle)
            .ok_or_else(|| SqsError::resource_not_found("No such message move task."))?;
        queue
    } else {
        let url = text(input, "QueueUrl")?;
        url.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string()
    };
    super::redrive::live_queue_named(state, account, &named_by)
        .await?
        .ok_or_else(SqsError::queue_does_not_exist)
}

/// Where `queue` answers SQS: its node's SQS endpoint and its id.
fn queue_url(state: &AppState, queue: &Queue) -> Result<String, SqsError> {
    let endpoint = state
        .sqs_endpoint(queue)
        .map_err(unavailable)?
        .ok_or_else(|| SqsError::unavailable("The queue's node does not serve SQS yet."))?;
    Ok(format!("{endpoint}/{}", queue.id))
}

/// Changes `queue`'s tags with `change`, within SQS's limits.
async fn change_tags(
    state: &AppState,
    queue: &Queue,
    change: impl Fn(&mut BTreeMap<String, String>),
) -> Result<Queue, SqsError> {
    let changed = state.store.update(&queue.id, |held| {
        let mut tags = held.tags.clone();
        change(&mut tags);
        queue::check_tags(&tags).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        held.tags = tags;
        Ok::<_, ApiError>(())
    });
    match changed.await {
        Ok(Some((queue, ()))) => Ok(queue),
        Ok(None) => Err(SqsError::queue_does_not_exist()),
        Err(ApiError::BadRequest(message)) => Err(SqsError::invalid_parameter(message)),
        Err(error) => Err(unavailable(error)),
    }
}

/// Hands a queue's action on to its node, as it came (its signature covers its host, path,
/// headers and body, and the node checks it with the same key), and its reply back.
async fn forward(
    state: &AppState,
    queue: &Queue,
    parts: axum::http::request::Parts,
    body: bytes::Bytes,
) -> Result<Response, SqsError> {
    let endpoint = state
        .sqs_endpoint(queue)
        .map_err(unavailable)?
        .ok_or_else(|| SqsError::unavailable("The queue's node does not serve SQS yet."))?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = parts.headers;
    for hop in [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
    ] {
        headers.remove(hop);
    }
    let sent = node_client(state)
        .post(format!("{endpoint}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|e| {
            tracing::debug!(error = %e, queue = %queue.id, "an SQS request could not be handed on");
            SqsError::unavailable("The queue's node cannot be reached now. Try again.")
        })?;
    let status = sent.status();
    let mut reply_headers = HeaderMap::new();
    for name in ["content-type", "x-amzn-requestid", "x-amzn-query-error"] {
        if let Some(value) = sent.headers().get(name) {
            reply_headers.insert(name, value.clone());
        }
    }
    let reply = sent.bytes().await.map_err(|_| {
        SqsError::unavailable("The queue's node did not finish its reply. Try again.")
    })?;
    let mut response = Response::new(Body::from(reply));
    *response.status_mut() = status;
    *response.headers_mut() = reply_headers;
    Ok(response)
}

/// The client that hands requests on to nodes: trusting `[sqs] node_roots`, or the public
/// web's roots; made once.
fn node_client(state: &AppState) -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        let roots = match state.config.sqs.node_roots_pem() {
            Some(pem) => qe_tls::roots_from_pem(pem),
            None => rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let tls = Arc::unwrap_or_clone(qe_tls::client_config(roots));
        reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client with a TLS config builds")
    })
}

fn text<'a>(input: &'a Value, name: &str) -> Result<&'a str, SqsError> {
    input[name]
        .as_str()
        .ok_or_else(|| SqsError::missing_parameter(name))
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A map of strings (attributes, tags).
fn string_map(value: &Value, name: &str) -> Result<BTreeMap<String, String>, SqsError> {
    let object = value
        .as_object()
        .ok_or_else(|| SqsError::missing_parameter(name))?;
    object
        .iter()
        .map(|(key, value)| match value.as_str() {
            Some(text) => Ok((key.clone(), text.to_string())),
            None => Err(SqsError::invalid_parameter(format!(
                "{name}: every value is a string."
            ))),
        })
        .collect()
}

fn unavailable(error: ApiError) -> SqsError {
    SqsError::unavailable(&error.to_string())
}

fn store_error(error: crate::store::StoreError) -> SqsError {
    SqsError::unavailable(&error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_next_token_reads_back_and_a_made_up_one_is_refused() {
        assert_eq!(read_token(&token_of("orders-7")).unwrap(), "orders-7");
        assert_eq!(read_token("!!").unwrap_err().code, "InvalidParameterValue");
    }

    #[test]
    fn only_the_accounts_actions_run_here() {
        for name in NODE_ACTIONS {
            assert_eq!(Action::parse(name), None, "{name}");
        }
        assert!(!Action::parse("ListDeadLetterSourceQueues")
            .unwrap()
            .changes());
        let create = Action::parse("CreateQueue").unwrap();
        assert_eq!(create.name(), "CreateQueue");
        assert!(create.changes());
        assert!(!Action::parse("ListQueues").unwrap().changes());
    }
}
