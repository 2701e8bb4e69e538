//! The manual's subscriber program, on the library: handle every message and acknowledge it.
//! Unlike the manual's, it reconnects when the connection drops, and resumes its session.
//!
//! ```sh
//! QE_ADDRESS=ws://127.0.0.1:8080/ cargo run -p qe-client --example subscriber
//! ```
//!
//! `QE_ADDRESS`, `QE_USERNAME` and `QE_PASSWORD` override the manual's example values.

use futures::StreamExt;
use qe_client::{Credentials, Endpoint, Event, Subscriber};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
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
    while let Some(event) = subscriber.next().await {
        match event {
            Ok(Event::Message(delivery)) => {
                println!("Received: {}", delivery.text().unwrap_or("(binary)"));
                if let Err(error) = delivery.ack().await {
                    println!("Failed: {error}");
                }
            }
            Ok(Event::Disconnected { error }) => println!("Connection error: {error}"),
            Ok(Event::Reconnected { resumed, released }) => match resumed {
                true => println!("Reconnected; the session was resumed"),
                false => println!("Reconnected as a new session; may come again: {released:?}"),
            },
            Ok(other) => println!("{other:?}"),
            Err(error) => {
                println!("Failed: {error}");
                break;
            }
        }
    }
    Ok(())
}
