//! Both ends of a channel through the C API, in two threads of this process: copies, loans,
//! buffer sends, views and their release, bad input on each side, the transport report and
//! the fd; a fan-in's configuration, its list of peers and its producer's slot.

use std::ffi::{c_void, CStr, CString};
use std::ptr;

use crate::alloc::{lf_alloc, lf_register};
use crate::buffer::{lf_buffer_ptr, lf_free, lf_memory_kind};
use crate::channel::*;
use crate::channel_config::*;
use crate::context::{lf_context, lf_context_config, lf_context_create, lf_context_free, lf_gpu_policy};
use crate::location::{lf_location, lf_location_detect, lf_location_free};
use crate::peers::{lf_channel_peers, lf_peer, lf_peer_state, LF_MAX_PEERS};
use crate::receive::*;
use crate::send::*;
use crate::status::lf_status;
use crate::tests::last_error;

struct Loc(*mut lf_location, *mut lf_context);
// SAFETY: locations are immutable and contexts thread-safe; the test frees them after both
// threads finish.
unsafe impl Send for Loc {}
unsafe impl Sync for Loc {}

#[test]
fn send_loan_receive_release_through_the_c_api() {
    unsafe {
        let mut loc = ptr::null_mut();
        assert_eq!(lf_location_detect(&mut loc), lf_status::LF_OK);
        let context_config =
            lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
        let mut context = ptr::null_mut();
        assert_eq!(lf_context_create(&context_config, &mut context), lf_status::LF_OK);
        let loc = Loc(loc, context);
        let name = CString::new(format!("ffi-unit-{}", std::process::id())).unwrap();
        let mut config: lf_channel_config = std::mem::zeroed();
        assert_eq!(lf_channel_config_init(&mut config, std::mem::size_of_val(&config)), lf_status::LF_OK);
        config.wait_strategy = lf_wait_strategy::LF_WAIT_BLOCK as u32;
        config.capacity = 8;
        let (loc_ref, name_ref, config_ref) = (&loc, &name, &config);
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut ch = ptr::null_mut();
                assert_eq!(
                    lf_channel_create(
                        loc_ref.1,
                        name_ref.as_ptr(),
                        lf_role::LF_ROLE_PRODUCER as u32,
                        loc_ref.0,
                        loc_ref.0,
                        config_ref,
                        &mut ch
                    ),
                    lf_status::LF_OK,
                    "{}",
                    last_error()
                );
                let mut seq = 99;
                assert_eq!(lf_send(ch, b"hello".as_ptr().cast(), 5, -1, &mut seq), lf_status::LF_OK);
                assert_eq!(seq, 0);
                // Bad input.
                assert_eq!(lf_send(ch, ptr::null(), 5, -1, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
                assert_eq!(
                    lf_send(ch, b"x".as_ptr().cast(), 0, -1, ptr::null_mut()),
                    lf_status::LF_ERR_INVALID_ARGUMENT
                );
                let mut m: lf_message = std::mem::zeroed();
                assert_eq!(lf_try_recv(ch, &mut m), lf_status::LF_ERR_INVALID_STATE);
                let mut loan: lf_loan_region = std::mem::zeroed();
                assert_eq!(lf_loan(ch, 1000, -1, &mut loan), lf_status::LF_OK);
                let mut second: lf_loan_region = std::mem::zeroed();
                assert_eq!(lf_loan(ch, 10, -1, &mut second), lf_status::LF_ERR_INVALID_STATE, "one loan at a time");
                ptr::write_bytes(loan.data.cast::<u8>(), 0x5a, 1000);
                let forged = lf_loan_region { token: loan.token + 1, ..loan };
                assert_eq!(lf_publish(ch, &forged, 1000, ptr::null_mut()), lf_status::LF_ERR_INVALID_STATE);
                assert_eq!(lf_publish(ch, &loan, 1001, ptr::null_mut()), lf_status::LF_ERR_INVALID_ARGUMENT);
                assert_eq!(lf_publish(ch, &loan, 1000, &mut seq), lf_status::LF_OK);
                assert_eq!(seq, 1);
                assert_eq!(
                    lf_publish(ch, &loan, 1000, ptr::null_mut()),
                    lf_status::LF_ERR_INVALID_STATE,
                    "published twice"
                );
                assert_eq!(lf_wait_completed(ch, 1, 10_000_000_000), lf_status::LF_OK, "{}", last_error());
                let mut done = 0;
                assert_eq!(lf_completed(ch, &mut done), lf_status::LF_OK);
                assert_eq!(done, 2);
                // Buffer sends: explicit, and by itself for bytes inside a buffer.
                let mut buf = ptr::null_mut();
                assert_eq!(
                    lf_alloc(loc_ref.1, 8192, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, -1, 0, &mut buf),
                    lf_status::LF_OK
                );
                let mut base: *mut c_void = ptr::null_mut();
                assert_eq!(lf_buffer_ptr(buf, &mut base), lf_status::LF_OK);
                let base = base.cast::<u8>();
                ptr::write_bytes(base, 0x33, 8192);
                assert_eq!(lf_send_buffer(ch, buf, 100, 4000, -1, &mut seq), lf_status::LF_OK, "{}", last_error());
                assert_eq!(seq, 2);
                assert_eq!(lf_send(ch, base.add(200).cast(), 1000, -1, &mut seq), lf_status::LF_OK);
                assert_eq!(seq, 3);
                assert_eq!(lf_send_buffer(ch, buf, 8000, 193, -1, ptr::null_mut()), lf_status::LF_ERR_INVALID_ARGUMENT);
                assert_eq!(lf_send_buffer(ch, buf, 0, 0, -1, ptr::null_mut()), lf_status::LF_ERR_INVALID_ARGUMENT);
                assert_eq!(lf_send_buffer(ch, ptr::null(), 0, 1, -1, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
                let mut user = vec![0u8; 4096];
                let mut registered = ptr::null_mut();
                assert_eq!(lf_register(loc_ref.1, user.as_mut_ptr().cast(), 4096, &mut registered), lf_status::LF_OK);
                assert_eq!(lf_send_buffer(ch, registered, 0, 10, -1, ptr::null_mut()), lf_status::LF_ERR_UNSUPPORTED);
                assert!(last_error().contains("registered user memory"), "{}", last_error());
                lf_free(registered);
                assert_eq!(lf_wait_completed(ch, 3, 10_000_000_000), lf_status::LF_OK, "{}", last_error());
                lf_free(buf);
                let (mut tname, mut reason) = (ptr::null(), ptr::null());
                assert_eq!(lf_channel_transport(ch, &mut tname, &mut reason), lf_status::LF_OK);
                assert_eq!(CStr::from_ptr(tname).to_str().unwrap(), "shm");
                assert!(CStr::from_ptr(reason).to_str().unwrap().contains("scope local"));
                lf_channel_free(ch);
                assert_eq!(lf_send(ch, b"x".as_ptr().cast(), 1, -1, ptr::null_mut()), lf_status::LF_ERR_BAD_HANDLE);
            });
            s.spawn(move || {
                let mut ch = ptr::null_mut();
                assert_eq!(
                    lf_channel_create(
                        loc_ref.1,
                        name_ref.as_ptr(),
                        lf_role::LF_ROLE_CONSUMER as u32,
                        loc_ref.0,
                        loc_ref.0,
                        config_ref,
                        &mut ch
                    ),
                    lf_status::LF_OK,
                    "{}",
                    last_error()
                );
                let mut fd = -1;
                assert_eq!(lf_channel_fd(ch, &mut fd), lf_status::LF_OK);
                assert!(fd >= 0);
                let mut m: lf_message = std::mem::zeroed();
                assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_OK, "{}", last_error());
                assert_eq!(std::slice::from_raw_parts(m.data.cast::<u8>(), m.len), b"hello");
                let mut big: lf_message = std::mem::zeroed();
                assert_eq!(lf_recv(ch, 10_000_000_000, &mut big), lf_status::LF_OK);
                assert_eq!(big.len, 1000);
                assert!(std::slice::from_raw_parts(big.data.cast::<u8>(), big.len).iter().all(|&b| b == 0x5a));
                let forged = lf_message { len: 4, ..m };
                assert_eq!(lf_release(ch, &forged), lf_status::LF_ERR_INVALID_STATE);
                assert_eq!(lf_release(ch, &m), lf_status::LF_OK);
                assert_eq!(lf_release(ch, &m), lf_status::LF_ERR_INVALID_STATE, "released twice");
                assert!(last_error().contains("not held"), "{}", last_error());
                assert_eq!(lf_release(ch, &big), lf_status::LF_OK);
                assert_eq!(m.flags & LF_MESSAGE_ZERO_COPY, 0);
                for (len, byte) in [(4000, 0x33u8), (1000, 0x33)] {
                    let mut view: lf_message = std::mem::zeroed();
                    assert_eq!(lf_recv(ch, 10_000_000_000, &mut view), lf_status::LF_OK, "{}", last_error());
                    assert_eq!((view.len, view.flags), (len, LF_MESSAGE_ZERO_COPY));
                    assert!(std::slice::from_raw_parts(view.data.cast::<u8>(), view.len).iter().all(|&b| b == byte));
                    assert_eq!(lf_release(ch, &view), lf_status::LF_OK);
                }
                assert_eq!(lf_send(ch, b"x".as_ptr().cast(), 1, -1, ptr::null_mut()), lf_status::LF_ERR_INVALID_STATE);
                assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_ERR_PEER_GONE);
                lf_channel_free(ch);
                lf_channel_free(ptr::null_mut());
            });
        });
        lf_location_free(loc.0);
        assert_eq!(
            lf_channel_create(loc.1, ptr::null(), 1, ptr::null(), ptr::null(), ptr::null(), ptr::null_mut()),
            lf_status::LF_ERR_NULL_POINTER
        );
        let mut ch = ptr::null_mut();
        assert_eq!(
            lf_channel_create(
                loc.1,
                CString::new("x").unwrap().as_ptr(),
                7,
                ptr::null(),
                ptr::null(),
                ptr::null(),
                &mut ch
            ),
            lf_status::LF_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            lf_channel_create(
                ptr::null(),
                CString::new("x").unwrap().as_ptr(),
                1,
                ptr::null(),
                ptr::null(),
                ptr::null(),
                &mut ch
            ),
            lf_status::LF_ERR_NULL_POINTER
        );
        assert!(ch.is_null());
        lf_context_free(loc.1);
    }
}

/// Creates one end of `name` with `config`; the status, and the message on failure.
unsafe fn create_end(
    loc: &Loc,
    name: &CString,
    role: lf_role,
    config: &lf_channel_config,
    out: &mut *mut lf_channel,
) -> (lf_status, String) {
    let status = lf_channel_create(loc.1, name.as_ptr(), role as u32, loc.0, loc.0, config, out);
    (status, if status == lf_status::LF_OK { String::new() } else { last_error() })
}

unsafe fn cpu_context_here() -> Loc {
    let mut loc = ptr::null_mut();
    assert_eq!(lf_location_detect(&mut loc), lf_status::LF_OK);
    let context_config = lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
    let mut context = ptr::null_mut();
    assert_eq!(lf_context_create(&context_config, &mut context), lf_status::LF_OK);
    Loc(loc, context)
}

fn fan_in_config() -> lf_channel_config {
    lf_channel_config {
        kind: lf_channel_kind::LF_CHANNEL_FAN_IN as u32,
        max_peers: 4,
        rendezvous_timeout_ns: 10_000_000_000,
        ..Default::default()
    }
}

#[test]
fn fan_in_config_values_are_refused_on_either_end_before_any_rendezvous() {
    unsafe {
        let loc = cpu_context_here();
        let name = CString::new(format!("ffi-fan-in-bad-{}", std::process::id())).unwrap();
        let base = fan_in_config();
        let cases: [(lf_channel_config, lf_status, &str); 6] = [
            (
                lf_channel_config { max_peers: 0, ..base },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "max_peers 0 must be from 1 to 64",
            ),
            (
                lf_channel_config { max_peers: 65, ..base },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "max_peers 65 must be from 1 to 64",
            ),
            (
                lf_channel_config { kind: 7, ..base },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "kind is 7, not an lf_channel_kind: use LF_CHANNEL_PAIR (0), LF_CHANNEL_FAN_IN (1) or \
                 LF_CHANNEL_FAN_OUT (2)",
            ),
            (
                lf_channel_config { slow_consumer_timeout_ns: 0, ..base },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "slow_consumer_timeout is a fan-out setting, and this channel is a fan-in",
            ),
            (
                lf_channel_config { slow_consumer_timeout_ns: 5_000_000, ..base },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "slow_consumer_timeout is a fan-out setting",
            ),
            (
                lf_channel_config {
                    kind: lf_channel_kind::LF_CHANNEL_PAIR as u32,
                    slow_consumer_timeout_ns: 0,
                    ..base
                },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "slow_consumer_timeout is a fan-out setting, and this channel is a pair",
            ),
        ];
        for (config, status, needle) in cases {
            for role in [lf_role::LF_ROLE_PRODUCER, lf_role::LF_ROLE_CONSUMER] {
                let mut ch = ptr::null_mut();
                // No peer ever comes: a refusal after a rendezvous would take the 10 s timeout
                // and answer LF_ERR_TIMEOUT instead.
                let (got, message) = create_end(&loc, &name, role, &config, &mut ch);
                assert_eq!(got, status, "{role:?} with {config:?}: {message}");
                assert!(message.starts_with("lf_channel_create: ") && message.contains(needle), "{message}");
                assert!(ch.is_null());
            }
        }
        lf_location_free(loc.0);
        lf_context_free(loc.1);
    }
}

#[test]
fn fan_in_peers_and_producer_slot_through_the_c_api() {
    unsafe {
        let loc = cpu_context_here();
        let name = CString::new(format!("ffi-fan-in-{}", std::process::id())).unwrap();
        let config = fan_in_config();
        let (loc_ref, name_ref, config_ref) = (&loc, &name, &config);
        let (checked_tx, checked_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut ch = ptr::null_mut();
                let (status, message) = create_end(loc_ref, name_ref, lf_role::LF_ROLE_PRODUCER, config_ref, &mut ch);
                assert_eq!(status, lf_status::LF_OK, "{message}");
                // A fan-in's producer has one consumer, whose pid it does not know.
                let mut count = 99;
                let mut peers: [lf_peer; 1] = std::mem::zeroed();
                assert_eq!(
                    lf_channel_peers(ch, peers.as_mut_ptr(), std::mem::size_of::<lf_peer>(), 1, &mut count),
                    lf_status::LF_OK
                );
                assert_eq!((count, peers[0].slot, peers[0].state), (1, 0, lf_peer_state::LF_PEER_ALIVE as u32));
                assert_eq!(lf_send(ch, b"first".as_ptr().cast(), 5, -1, ptr::null_mut()), lf_status::LF_OK);
                checked_rx.recv().unwrap();
                lf_channel_free(ch);
            });
            s.spawn(move || {
                let mut ch = ptr::null_mut();
                let (status, message) = create_end(loc_ref, name_ref, lf_role::LF_ROLE_CONSUMER, config_ref, &mut ch);
                assert_eq!(status, lf_status::LF_OK, "{message}");
                let mut m: lf_message = std::mem::zeroed();
                m.producer = 77;
                assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_OK, "{}", last_error());
                assert_eq!((m.producer, m.sequence, m.len), (0, 0, 5), "the lowest free slot, its first message");
                assert_eq!(lf_release(ch, &m), lf_status::LF_OK);

                // Bad input, each refused with the argument named and nothing written.
                let size = std::mem::size_of::<lf_peer>();
                let mut peers: [lf_peer; LF_MAX_PEERS as usize] = std::mem::zeroed();
                let mut count = 99;
                assert_eq!(
                    lf_channel_peers(ch, peers.as_mut_ptr(), size, peers.len(), ptr::null_mut()),
                    lf_status::LF_ERR_NULL_POINTER
                );
                assert!(last_error().contains("`count`"), "{}", last_error());
                assert_eq!(lf_channel_peers(ch, ptr::null_mut(), size, 1, &mut count), lf_status::LF_ERR_NULL_POINTER);
                assert!(last_error().contains("`peers`"), "{}", last_error());
                for wrong in [0, size - 4, size + 8] {
                    assert_eq!(
                        lf_channel_peers(ch, peers.as_mut_ptr(), wrong, peers.len(), &mut count),
                        lf_status::LF_ERR_INVALID_ARGUMENT
                    );
                    let message = last_error();
                    assert!(message.contains(&format!("peer_size is {wrong}")) && message.contains("sizeof(lf_peer)"));
                }
                assert_eq!(count, 99);
                assert_eq!(
                    lf_channel_peers(ptr::null(), peers.as_mut_ptr(), size, peers.len(), &mut count),
                    lf_status::LF_ERR_NULL_POINTER
                );

                // The count alone (NULL peers, capacity 0), then a list too short, then all.
                assert_eq!(lf_channel_peers(ch, ptr::null_mut(), size, 0, &mut count), lf_status::LF_OK);
                assert_eq!(count, 4, "one entry per slot of max_peers");
                let marker: lf_peer = lf_peer { slot: 999, ..std::mem::zeroed() };
                peers = [marker; LF_MAX_PEERS as usize];
                assert_eq!(lf_channel_peers(ch, peers.as_mut_ptr(), size, 2, &mut count), lf_status::LF_OK);
                assert_eq!(count, 4);
                assert_eq!((peers[0].slot, peers[1].slot, peers[2].slot), (0, 1, 999), "no more than capacity");
                assert_eq!(lf_channel_peers(ch, peers.as_mut_ptr(), size, peers.len(), &mut count), lf_status::LF_OK);
                assert_eq!((count, peers[4].slot), (4, 999));
                let text = |s: &[std::ffi::c_char]| CStr::from_ptr(s.as_ptr()).to_str().unwrap().to_owned();
                let first = &peers[0];
                assert_eq!((first.slot, first.state), (0, lf_peer_state::LF_PEER_ALIVE as u32));
                assert_eq!((first.pid, first.rank), (std::process::id(), -1));
                assert_eq!(text(&first.route), "shm");
                assert!(!text(&first.host).is_empty());
                for (at, free) in peers[1..4].iter().enumerate() {
                    assert_eq!(
                        (free.slot, free.state, free.pid),
                        (at as u32 + 1, lf_peer_state::LF_PEER_FREE as u32, 0)
                    );
                    assert_eq!((text(&free.host), text(&free.route)), (String::new(), String::new()));
                }
                checked_tx.send(()).unwrap();

                // The producer's end names its slot; then the slot is free again.
                m.producer = 77;
                assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_ERR_PEER_GONE, "{}", last_error());
                assert!(last_error().contains("slot 0"), "{}", last_error());
                assert_eq!((m.producer, m.len, m.data), (0, 0, ptr::null()));
                assert_eq!(lf_channel_peers(ch, peers.as_mut_ptr(), size, peers.len(), &mut count), lf_status::LF_OK);
                assert!(peers[..4].iter().all(|p| p.state == lf_peer_state::LF_PEER_FREE as u32));
                // With no producer attached, the fan-in waits for one.
                assert_eq!(lf_try_recv(ch, &mut m), lf_status::LF_ERR_WOULD_BLOCK, "{}", last_error());
                lf_channel_free(ch);
            });
        });
        lf_location_free(loc.0);
        lf_context_free(loc.1);
    }
}
