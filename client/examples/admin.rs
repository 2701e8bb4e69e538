//! The manual's admin program, on the library: print the queue's live counters.
//!
//! ```sh
//! QE_ADDRESS=ws://127.0.0.1:8080/ cargo run -p qe-client --example admin
//! ```
//!
//! `QE_ADDRESS`, `QE_USERNAME` and `QE_PASSWORD` override the manual's example values.

use qe_client::{Admin, Credentials, Endpoint};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() {
    let address = setting("QE_ADDRESS", "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/");
    let login = Credentials::new(
        setting("QE_USERNAME", "ADMIN-NAME"),
        setting("QE_PASSWORD", "ADMIN-PASSWORD"),
    );
    let stats = async {
        let endpoint = Endpoint::new(&address)?;
        let admin = Admin::connect(&endpoint, login).await?;
        admin.live_stats().await
    };
    match stats.await {
        Ok(stats) => {
            println!("Messages in the queue: {}", stats.messages);
            println!("{stats:#?}");
        }
        Err(qe_client::Error::Refused { code, reason, .. }) => {
            println!("Failed: {} {reason}", code.number())
        }
        Err(error) => println!("Connection error: {error}"),
    }
}
