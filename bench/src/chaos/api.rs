//! The operator's calls the run itself makes (not measured): create a queue, wait until it
//! runs, read it. Each goes to one replica; the caller chooses which.

use super::replicas::TOKEN;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

/// The queue every run creates: what the local fleet runs.
const NEW_QUEUE: &str = r#"{"tier":"devtest","region":"local","instance_type":"local"}"#;

/// The longest a call may take: `?until=running&within=60` holds the reply up to a minute.
const CALL_WITHIN: Duration = Duration::from_secs(70);

#[derive(Clone)]
pub struct Operator {
    client: reqwest::Client,
}

impl Operator {
    pub fn new() -> Operator {
        // reqwest is built without a crypto provider of its own (the workspace's choice).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(CALL_WITHIN)
            .build()
            .expect("an HTTP client");
        Operator { client }
    }

    /// `POST /v1/queues`: the new queue, with its logins (shown this once).
    pub async fn create_queue(&self, api: SocketAddr) -> Result<Value, String> {
        let request = self
            .client
            .post(format!("http://{api}/v1/queues"))
            .header("Content-Type", "application/json")
            .body(NEW_QUEUE);
        expect(request, 201).await
    }

    /// `GET /v1/queues/ID?until=running&within=60`: the queue once it runs.
    pub async fn wait_running(&self, api: SocketAddr, id: &str) -> Result<Value, String> {
        let url = format!("http://{api}/v1/queues/{id}?until=running&within=60");
        let queue = expect(self.client.get(url), 200).await?;
        match queue["status"].as_str() {
            Some("running") => Ok(queue),
            _ => Err(format!("queue {id} does not run: {queue}")),
        }
    }

    /// `GET /v1/queues/ID`.
    pub async fn queue(&self, api: SocketAddr, id: &str) -> Result<Value, String> {
        expect(self.client.get(format!("http://{api}/v1/queues/{id}")), 200).await
    }
}

/// Sends `request` with the operator's token; its JSON body if the status is `status`.
async fn expect(request: reqwest::RequestBuilder, status: u16) -> Result<Value, String> {
    let response = request
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let answered = response.status().as_u16();
    let text = response.text().await.map_err(|e| format!("{e:?}"))?;
    match answered == status {
        true => serde_json::from_str(&text).map_err(|e| format!("{e}: {text}")),
        false => Err(format!("{answered}: {text}")),
    }
}
