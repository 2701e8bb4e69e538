//! The manual's publisher program, on the library: log in, publish one message, print its id.
//!
//! ```sh
//! QE_ADDRESS=ws://127.0.0.1:8080/ cargo run -p qe-client --example publisher
//! ```
//!
//! `QE_ADDRESS`, `QE_USERNAME` and `QE_PASSWORD` override the manual's example values.

use qe_client::{Credentials, Endpoint, Message, Publisher};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() {
    let address = setting("QE_ADDRESS", "wss://QUEUE-ID.q.CLUSTER.thequeueexpert.com/");
    let login = Credentials::new(
        setting("QE_USERNAME", "PUBLISHER-NAME"),
        setting("QE_PASSWORD", "PUBLISHER-PASSWORD"),
    );
    let published = async {
        let endpoint = Endpoint::new(&address)?;
        let publisher = Publisher::connect(&endpoint, login).await?;
        publisher.publish(Message::text("Hello from Rust")).await
    };
    match published.await {
        Ok(id) => println!("Published. The message id is {id}"),
        Err(qe_client::Error::Refused { code, reason, .. }) => {
            println!("Failed: {} {reason}", code.number())
        }
        Err(error) => println!("Connection error: {error}"),
    }
}
