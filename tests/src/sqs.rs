//! Amazon's own Rust SDK (`aws-sdk-sqs`) pointed at a node's SQS face, as a user holding
//! code written against AWS would point it: an endpoint URL, a region, static keys.
//!
//! The HTTP client is aws-smithy-http-client on the workspace's ring-only rustls (the SDK's
//! default one would bring aws-lc-rs), trusting only the CA the test gives; a name may be
//! resolved to an address the test gives (a node in a network namespace, by its queue's name).

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::operation::send_message::SendMessageOutput;
use aws_sdk_sqs::types::{Message, QueueAttributeName};
use aws_sdk_sqs::Client;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode, TlsContext, TrustStore};
use aws_smithy_runtime_api::client::dns::{DnsFuture, ResolveDns};
use std::collections::HashMap;
use std::net::IpAddr;

pub use aws_sdk_sqs;

/// Where the client connects and what it trusts.
pub struct SqsEndpoint<'a> {
    /// `https://NAME:PORT` or `http://ADDR`.
    pub url: &'a str,
    /// The CA the node's certificate is from (PEM), for `https://`.
    pub ca_pem: Option<&'a str>,
    /// The address the endpoint's name resolves to, instead of the system's resolver.
    pub resolve_to: Option<IpAddr>,
}

/// A client of `node`'s plain SQS face (`--sqs-listen` on loopback) signing with `key_id` and
/// `secret`.
pub fn client_of(node: &crate::Node, key_id: &str, secret: &str) -> Client {
    let url = format!("http://{}", node.sqs_addr());
    let endpoint = SqsEndpoint {
        url: &url,
        ca_pem: None,
        resolve_to: None,
    };
    client(&endpoint, key_id, secret)
}

/// A client of the SDK signing with `key_id` and `secret`, with no retries (a refusal is
/// seen as it comes).
pub fn client(endpoint: &SqsEndpoint, key_id: &str, secret: &str) -> Client {
    let trust = match endpoint.ca_pem {
        Some(pem) => TrustStore::empty().with_pem_certificate(pem.as_bytes()),
        None => TrustStore::empty(),
    };
    let context = TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .expect("a TLS context");
    let builder = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .tls_context(context);
    let http = match endpoint.resolve_to {
        Some(ip) => builder.build_with_resolver(FixedAddress(ip)),
        None => builder.build_https(),
    };
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("eu-west-1"))
        .credentials_provider(Credentials::new(key_id, secret, None, None, "test"))
        .endpoint_url(endpoint.url)
        .http_client(http)
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
        .build();
    Client::from_conf(config)
}

/// The URL of a lone node's queue (named `queue`), as GetQueueUrl gives it.
pub async fn lone_queue_url(sqs: &Client) -> String {
    let got = sqs
        .get_queue_url()
        .queue_name("queue")
        .send()
        .await
        .unwrap();
    got.queue_url().unwrap().to_string()
}

/// What a receive of up to `max` messages, waiting up to `wait` seconds, got.
pub async fn receive(sqs: &Client, queue: &str, max: i32, wait: i32) -> Vec<Message> {
    let asked = sqs.receive_message().queue_url(queue);
    let got = asked.max_number_of_messages(max).wait_time_seconds(wait);
    got.send().await.unwrap().messages().to_vec()
}

pub async fn send(sqs: &Client, queue: &str, body: &str) -> SendMessageOutput {
    let sent = sqs.send_message().queue_url(queue).message_body(body);
    sent.send().await.unwrap()
}

pub async fn delete(sqs: &Client, queue: &str, message: &Message) {
    let handle = message.receipt_handle().unwrap();
    let deleted = sqs.delete_message().queue_url(queue).receipt_handle(handle);
    deleted.send().await.unwrap();
}

/// Every attribute of the queue.
pub async fn queue_attributes(sqs: &Client, queue: &str) -> HashMap<QueueAttributeName, String> {
    let asked = sqs.get_queue_attributes().queue_url(queue);
    let shown = asked.attribute_names(QueueAttributeName::All).send().await;
    shown.unwrap().attributes().unwrap().clone()
}

/// Every name resolves to one address.
#[derive(Clone, Debug)]
struct FixedAddress(IpAddr);

impl ResolveDns for FixedAddress {
    fn resolve_dns<'a>(&'a self, _name: &'a str) -> DnsFuture<'a> {
        DnsFuture::ready(Ok(vec![self.0]))
    }
}
