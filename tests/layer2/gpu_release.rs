//! What a producer's released semaphore is owed when its consumer dies: the consumer held GPU
//! messages (or released them with a signal on its GPU still to come), and the producer's GPU
//! work waits on the released semaphore before it rewrites their buffers. The producer signals
//! the values itself once the consumer is dead, so that no stream waits for a dead process.
//! Where semaphores cannot be shared (lavapipe), the test says so and skips.

use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer};
use lava_flow::memory::gpu::TimelineSemaphore;
use lava_flow::memory::MemoryLocation;
use lava_flow::Error;

use crate::child::kill9;
use crate::common::*;
use crate::gpu::{gpu_config, gpu_ctx, write_message};

#[test]
fn a_dead_consumer_s_released_values_are_signalled_by_the_producer() {
    const TEST: &str = "gpu_release::a_dead_consumer_s_released_values_are_signalled_by_the_producer";
    let config = || ChannelConfig { released_semaphore: true, ..gpu_config() };
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return report("mode", "skip") };
            let mut p = Producer::create(&context, "released-kill", &here(), &here(), &config()).unwrap();
            let semaphore = match p.released_semaphore() {
                Ok(fd) => TimelineSemaphore::import(context.gpu_device().unwrap(), fd).unwrap(),
                Err(Error::Unsupported(why)) => {
                    println!("skipped: no released semaphore here: {why}");
                    return report("mode", "skip");
                }
                Err(e) => panic!("{e}"),
            };
            report("mode", "run");
            let gpu = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&gpu, 0, 4096, 0);
            p.send_buffer(&gpu, 0, 4096).unwrap();
            p.send_buffer(&gpu, 0, 4096).unwrap();
            // The consumer holds messages 0 and 1 and is killed: 2 covers both.
            let reached = semaphore.wait(2, Duration::from_secs(20)).unwrap();
            assert!(reached, "the released semaphore stayed at {:?} after the consumer died", semaphore.value());
            assert!(matches!(p.wait_completed(1, Some(Duration::from_secs(20))), Err(Error::PeerGone(_))));
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "released-kill", &here(), &here(), &config()).unwrap();
            let mut held = Vec::new();
            while held.len() < 2 {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Ok(m) => held.push(m),
                    // The producer skipped.
                    Err(Error::PeerGone(_)) => return,
                    Err(e) => panic!("{e}"),
                }
            }
            report("holding", held.len());
            // Killed here.
            std::thread::sleep(Duration::from_secs(60));
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("released-kill");
            let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &[]);
            let (mut c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &[]);
            if expect_line(&mut p_out, "mode") == "run" {
                expect_line(&mut c_out, "holding");
                kill9(&mut c);
            } else {
                wait_ok(c, "consumer");
            }
            wait_ok(p, "producer");
            assert_dir_empty(&dir);
        }
    }
}
