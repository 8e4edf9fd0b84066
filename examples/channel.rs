//! A complete minimal channel in Rust: run `channel consumer` and `channel producer` as two
//! processes on one host (either may start first).
//!
//! ```sh
//! cargo run --example channel -- consumer & cargo run --example channel -- producer
//! ```

use lava_flow::channels::{ChannelConfig, Consumer, Producer};
use lava_flow::memory::{Context, ContextConfig};
use lava_flow::ProcessLocation;

fn main() -> lava_flow::Result<()> {
    let role = std::env::args().nth(1).unwrap_or_default();
    let context = Context::new(ContextConfig::default())?; // one per process
    let here = ProcessLocation::from_hostname()?; // both processes on this host
    let config = ChannelConfig::default();

    match role.as_str() {
        "producer" => {
            let mut out = Producer::create(&context, "minimal", &here, &here, &config)?;
            for i in 0..3u32 {
                out.send(format!("message {i}").as_bytes())?; // copied into shared memory
            }
        }
        "consumer" => {
            let mut input = Consumer::create(&context, "minimal", &here, &here, &config)?;
            for _ in 0..3 {
                let message = input.recv()?; // a view into shared memory, released on drop
                println!("received {:?}", String::from_utf8_lossy(&message));
            }
        }
        _ => eprintln!("usage: channel producer|consumer"),
    }
    Ok(())
}
