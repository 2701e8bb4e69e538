//! A worker: handles each message, and acknowledges it once the handler has returned; a message
//! that is not what the worker expects goes to the dead letter queue. Delivery is at least
//! once: a worker stopped (or a node restarted) between handling and acknowledging gets the
//! message again, so handling must be safe to repeat.
//!
//! ```sh
//! QE_ADDRESS=ws://127.0.0.1:8080/ cargo run -p qe-client --example worker
//! ```
//!
//! `QE_ADDRESS`, `QE_USERNAME` and `QE_PASSWORD` override the manual's example values.

use qe_client::{Credentials, Delivery, Endpoint, Subscriber, Verdict};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// What this worker does with a message: one of text is "handled" (printed); a binary one is
/// not for this worker, ever.
async fn handle(delivery: Delivery) -> Verdict {
    match delivery.text() {
        Some(text) => {
            println!("Handled {}: {text}", delivery.id());
            Verdict::Ack
        }
        None => {
            println!("Rejected {}: not text", delivery.id());
            Verdict::Reject
        }
    }
}

#[tokio::main]
async fn main() -> qe_client::Result<()> {
    let address = setting("QE_ADDRESS", "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/");
    let login = Credentials::new(
        setting("QE_USERNAME", "SUBSCRIBER-NAME"),
        setting("QE_PASSWORD", "SUBSCRIBER-PASSWORD"),
    );
    let endpoint = Endpoint::new(&address)?;
    let mut subscriber = Subscriber::connect(&endpoint, login, 10).await?;
    // Returns only when the subscriber cannot go on (reconnections are handled within).
    subscriber.handle_each(handle).await
}
