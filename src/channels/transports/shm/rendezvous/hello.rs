//! The records of the meeting: the producer's hello (the channel's name and one section per
//! route it offers, descriptors attached) and the consumer's answer (its sections, or a
//! refusal with its reason), and how sections are encoded in both.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::io::ErrorKind;

use crate::channels::transport::Attachment;
use crate::error::{Error, Result};
use crate::os::stream::Stream;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The most bytes one section may hold, and the most sections a hello or answer carries.
pub const MAX_SECTION_LEN: usize = 1024;
pub const MAX_SECTIONS: usize = 8;
/// The most descriptors a hello carries (a bound on what a peer can make us hold).
pub const MAX_HELLO_FDS: usize = 8;

const HELLO_MAGIC: &[u8; 8] = b"LFHELLO2";
const ACK_MAGIC: &[u8; 8] = b"LFACK002";
/// Accepted; anything else is a refusal whose text follows.
pub const ACK_OK: u32 = 0;
pub const ACK_REFUSED: u32 = 1;

/// The start of a hello: the magic, then the channel name's length (the name follows, then
/// the section count and the sections).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HelloHead {
    magic: [u8; 8],
    name_len: U32,
}

/// The start of an answer's body: the magic, the status and the text's length (the text
/// follows, then the section count and the sections).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AckHead {
    magic: [u8; 8],
    status: U32,
    text_len: U32,
}

/// The start of a section, followed by its bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SectionHead {
    route: U32,
    fds: U32,
    len: U32,
}

fn put_sections(out: &mut Vec<u8>, sections: &[Attachment]) {
    out.extend_from_slice(U32::new(sections.len() as u32).as_bytes());
    for s in sections {
        let head = SectionHead {
            route: s.route.into(),
            fds: (s.handles.len() as u32).into(),
            len: (s.bytes.len() as u32).into(),
        };
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&s.bytes);
    }
}

/// Reads the sections at `bytes[at..]`, handing out `fds` in order; everything is checked.
fn take_sections(bytes: &[u8], mut at: usize, fds: Vec<OwnedHandle>, what: &str) -> Result<Vec<Attachment>> {
    let bad = |why: &str| Error::Corrupt(format!("rendezvous: the peer's {what} {why}"));
    let rest = |at: usize| bytes.get(at..).unwrap_or_default();
    let (count, _) = U32::read_from_prefix(rest(at)).map_err(|_| bad("is cut short"))?;
    let count = count.get() as usize;
    at += 4;
    if count > MAX_SECTIONS {
        return Err(bad(&format!("has {count} sections, more than {MAX_SECTIONS}")));
    }
    let mut fds = fds.into_iter();
    let mut sections = Vec::with_capacity(count);
    let mut fds_claimed = 0usize;
    for _ in 0..count {
        let (head, _) = SectionHead::read_from_prefix(rest(at)).map_err(|_| bad("is cut short"))?;
        let (route, fd_count, len) = (head.route.get(), head.fds.get() as usize, head.len.get() as usize);
        at += std::mem::size_of::<SectionHead>();
        if len > MAX_SECTION_LEN || fd_count > MAX_HELLO_FDS {
            return Err(bad(&format!("has a section of {len} bytes and {fd_count} descriptors")));
        }
        let body = bytes.get(at..at + len).ok_or_else(|| bad("is cut short"))?;
        at += len;
        fds_claimed += fd_count;
        let mine: Vec<OwnedHandle> = fds.by_ref().take(fd_count).collect();
        if mine.len() != fd_count {
            return Err(bad(&format!("claims {fds_claimed} descriptors but carries fewer")));
        }
        sections.push(Attachment { route, bytes: body.to_vec(), handles: mine });
    }
    if at != bytes.len() || fds.next().is_some() {
        return Err(bad("has trailing bytes or descriptors"));
    }
    Ok(sections)
}

/// Sends the producer's hello: the channel's name and every route's section, descriptors
/// attached in section order.
pub fn send_hello(sock: &Stream, name: &str, sections: &[Attachment]) -> Result<()> {
    let mut out = Vec::with_capacity(64 + name.len());
    out.extend_from_slice(HelloHead { magic: *HELLO_MAGIC, name_len: (name.len() as u32).into() }.as_bytes());
    out.extend_from_slice(name.as_bytes());
    put_sections(&mut out, sections);
    let fds: Vec<BorrowedHandle<'_>> =
        sections.iter().flat_map(|s| s.handles.iter().map(|f| crate::os::borrow(f))).collect();
    crate::os::stream::send_with_handles(sock, &out, &fds)
}

/// The largest hello, in bytes.
pub const MAX_HELLO_LEN: usize = 16 + 64 + 4 + MAX_SECTIONS * (12 + MAX_SECTION_LEN);

/// Parses a hello received with its descriptors: (channel name, sections).
pub fn decode_hello(bytes: &[u8], fds: Vec<OwnedHandle>) -> Result<(String, Vec<Attachment>)> {
    let bad = |what: &str| Error::Corrupt(format!("rendezvous: producer's hello {what}"));
    let head = match HelloHead::ref_from_prefix(bytes) {
        Ok((head, _)) if &head.magic == HELLO_MAGIC => head,
        _ => return Err(bad(
            "is not a lava-flow hello of this version (wrong magic or too short); use the same lava-flow on both sides",
        )),
    };
    let start = std::mem::size_of::<HelloHead>();
    let name_len = head.name_len.get() as usize;
    let name = bytes.get(start..start + name_len).ok_or_else(|| bad("has a name longer than itself"))?;
    let name = std::str::from_utf8(name).map_err(|_| bad("has a name that is not UTF-8"))?.to_owned();
    Ok((name, take_sections(bytes, start + name_len, fds, "hello")?))
}

/// Sends the consumer's answer to a hello: `ACK_OK` with its routes' sections (no
/// descriptors), or a refusal with its reason.
pub fn send_ack(sock: &Stream, status: u32, text: &str, sections: &[Attachment]) -> Result<()> {
    let text = &text.as_bytes()[..text.len().min(1000)];
    let mut out = Vec::with_capacity(16 + text.len());
    let head = AckHead { magic: *ACK_MAGIC, status: status.into(), text_len: (text.len() as u32).into() };
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(text);
    put_sections(&mut out, sections);
    let mut body = Vec::with_capacity(4 + out.len());
    body.extend_from_slice(U32::new(out.len() as u32).as_bytes());
    body.extend_from_slice(&out);
    crate::os::stream::send_all(sock, &body).map_err(|e| Error::os("sending the rendezvous answer", e))
}

/// Reads the consumer's answer: its sections on acceptance, the refusal as an error.
pub fn recv_ack(sock: &Stream, channel: &str) -> Result<Vec<Attachment>> {
    let read = |buf: &mut [u8]| {
        crate::os::stream::recv_exact(sock, buf).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout(format!(
                "the consumer of channel {channel:?} did not answer in time (it may already have a producer)"
            )),
            ErrorKind::UnexpectedEof => Error::PeerGone(format!(
                "the consumer of channel {channel:?} closed the connection during the rendezvous"
            )),
            _ => Error::os("reading the rendezvous answer", e),
        })
    };
    let mut len = U32::ZERO;
    read(len.as_mut_bytes())?;
    let len = len.get() as usize;
    if !(16..=MAX_ACK_LEN).contains(&len) {
        return Err(Error::Corrupt(format!("channel {channel:?}: the consumer's answer claims {len} bytes")));
    }
    let mut body = vec![0u8; len];
    read(&mut body)?;
    decode_ack(&body, channel)
}

/// The refusal in `bytes`, when they are an answer (a length word, then a refusing body)
/// where a hello was expected: a fan-out's producer refuses a consumer this way.
pub fn refusal_in(bytes: &[u8], channel: &str) -> Option<Error> {
    let body = bytes.get(4..)?;
    if body.get(..8) != Some(&ACK_MAGIC[..]) {
        return None;
    }
    match decode_ack(body, channel) {
        Err(Error::InvalidState(why)) => Some(Error::InvalidState(why.replace("the consumer of", "the producer of"))),
        Err(e) => Some(e),
        Ok(_) => Some(Error::Corrupt(format!("channel {channel:?}: the producer answered where it should offer"))),
    }
}

/// The largest answer body, in bytes.
pub const MAX_ACK_LEN: usize = MAX_HELLO_LEN + 1000;

/// Parses the body of the consumer's answer (after its length word): its sections on
/// acceptance, the refusal as an error, anything malformed as `Corrupt`. Pure, so that it can
/// be fuzzed.
pub fn decode_ack(body: &[u8], channel: &str) -> Result<Vec<Attachment>> {
    let head = match AckHead::ref_from_prefix(body) {
        Ok((head, _)) if &head.magic == ACK_MAGIC => head,
        _ => {
            return Err(Error::Corrupt(format!(
                "channel {channel:?}: the consumer's answer has the wrong magic (another lava-flow version?)"
            )))
        }
    };
    let start = std::mem::size_of::<AckHead>();
    let (status, text_len) = (head.status.get(), head.text_len.get() as usize);
    let text = body
        .get(start..start + text_len)
        .ok_or_else(|| Error::Corrupt(format!("channel {channel:?}: the consumer's answer is cut short")))?;
    if status != ACK_OK {
        return Err(Error::InvalidState(format!(
            "the consumer of channel {channel:?} refused this producer: {}",
            String::from_utf8_lossy(text)
        )));
    }
    take_sections(body, start + text_len, Vec::new(), "answer")
}

// Unix sockets and descriptors throughout.
#[cfg(all(unix, test))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_and_answer_round_trip_and_reject_garbage() {
        let (a, b) = Stream::pair().unwrap();
        let fd = crate::os::event::new().unwrap();
        let sections =
            vec![Attachment { route: 1, bytes: vec![1, 2, 3], handles: vec![fd] }, Attachment::new(2, vec![9])];
        send_hello(&a, "ch", &sections).unwrap();
        let mut buf = vec![0u8; MAX_HELLO_LEN];
        let (n, fds) = crate::os::stream::recv_with_handles(&b, &mut buf).unwrap();
        let (name, got) = decode_hello(&buf[..n], fds).unwrap();
        assert_eq!(name, "ch");
        assert_eq!((got[0].route, got[0].bytes.as_slice(), got[0].handles.len()), (1, &[1u8, 2, 3][..], 1));
        assert_eq!((got[1].route, got[1].bytes.as_slice(), got[1].handles.len()), (2, &[9u8][..], 0));
        assert!(matches!(decode_hello(b"garbage", Vec::new()), Err(Error::Corrupt(_))));
        // A section that claims a descriptor the message does not carry.
        let mut bytes = buf[..n].to_vec();
        assert!(matches!(decode_hello(&bytes, Vec::new()), Err(Error::Corrupt(_))));
        bytes.push(0);
        assert!(matches!(decode_hello(&bytes, Vec::new()), Err(Error::Corrupt(_))));
        send_ack(&b, ACK_OK, "", &[Attachment::new(7, vec![5; 40])]).unwrap();
        let answer = recv_ack(&a, "ch").unwrap();
        assert_eq!((answer[0].route, answer[0].bytes.len()), (7, 40));
        send_ack(&b, ACK_REFUSED, "no thanks", &[]).unwrap();
        assert!(matches!(recv_ack(&a, "ch"), Err(Error::InvalidState(ref m)) if m.contains("no thanks")));
    }

    fn valid_hello() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&5u32.to_le_bytes());
        out.extend_from_slice(b"frame");
        put_sections(&mut out, &[Attachment::new(1, vec![3; 24]), Attachment::new(2, vec![9; 40])]);
        out
    }

    fn valid_ack() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(ACK_MAGIC);
        out.extend_from_slice(&ACK_OK.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        put_sections(&mut out, &[Attachment::new(2, vec![1; 40])]);
        out
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(3000))]

        /// A producer's hello, with up to three descriptors attached: accepted only when every
        /// section is within bounds and every descriptor claimed is there, and then exactly
        /// what its bytes encode.
        #[test]
        fn fuzz_hello(bytes in crate::fuzz::bytes_near(valid_hello(), 200), fd_count in 0usize..3) {
            let fds: Vec<OwnedHandle> = (0..fd_count).map(|_| crate::os::event::new().unwrap()).collect();
            if let Ok((name, sections)) = decode_hello(&bytes, fds) {
                prop_assert!(sections.len() <= MAX_SECTIONS);
                prop_assert_eq!(sections.iter().map(|s| s.handles.len()).sum::<usize>(), fd_count);
                let mut again = Vec::new();
                again.extend_from_slice(HELLO_MAGIC);
                again.extend_from_slice(&(name.len() as u32).to_le_bytes());
                again.extend_from_slice(name.as_bytes());
                for s in &sections {
                    prop_assert!(s.bytes.len() <= MAX_SECTION_LEN);
                }
                let counts: Vec<u32> = sections.iter().map(|s| s.handles.len() as u32).collect();
                again.extend_from_slice(&(sections.len() as u32).to_le_bytes());
                for (s, fds) in sections.iter().zip(counts) {
                    again.extend_from_slice(&s.route.to_le_bytes());
                    again.extend_from_slice(&fds.to_le_bytes());
                    again.extend_from_slice(&(s.bytes.len() as u32).to_le_bytes());
                    again.extend_from_slice(&s.bytes);
                }
                prop_assert_eq!(again, bytes);
            }
        }

        /// The consumer's answer: accepted, refused (InvalidState, carrying its text) or
        /// Corrupt; never a panic, never a descriptor.
        #[test]
        fn fuzz_ack(bytes in crate::fuzz::bytes_near(valid_ack(), 200)) {
            match decode_ack(&bytes, "ch") {
                Ok(sections) => {
                    prop_assert!(sections.len() <= MAX_SECTIONS && sections.iter().all(|s| s.handles.is_empty()));
                    prop_assert!(sections.iter().all(|s| s.bytes.len() <= MAX_SECTION_LEN));
                }
                Err(Error::InvalidState(m)) => prop_assert!(m.contains("refused")),
                Err(Error::Corrupt(_)) => {}
                Err(other) => prop_assert!(false, "unexpected error class: {}", other),
            }
        }
    }
}
