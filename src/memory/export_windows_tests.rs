//! Export and import between two real Windows processes: the section and the descriptor
//! travel over the platform's stream (a named pipe), the child maps the same bytes.

use std::time::{Duration, Instant};

use super::*;
use crate::memory::{Context, ContextConfig, GpuPolicy};
use crate::os::stream::{connect, Listener};
use crate::os::test_child;

fn context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    Context::new(config).unwrap()
}

/// The parent exports a buffer; the child imports it, finds the parent's bytes, writes its
/// own, and says so; the parent sees the child's bytes in its buffer.
#[test]
fn an_export_is_imported_by_another_process() {
    let test = test_child::test_path(module_path!(), "an_export_is_imported_by_another_process");
    if test_child::role().as_deref() == Some("importer") {
        let path = std::path::PathBuf::from(std::env::var("LF_TEST_PIPE").unwrap());
        let start = Instant::now();
        let stream = loop {
            match connect(&path) {
                Ok(stream) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    assert!(start.elapsed() < Duration::from_secs(60), "the exporter never listened: {e}");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("connecting to the exporter: {e}"),
            }
        };
        let handle = ExportHandle::recv(&stream).unwrap();
        assert_eq!(handle.descriptor.exporter_pid, stream.peer().pid as u32);
        let context = context();
        let imported = context.import(handle).unwrap();
        assert_eq!(imported.origin(), BufferOrigin::Imported { exporter_pid: stream.peer().pid as u32 });
        let mut bytes = [0u8; 3];
        imported.read_at(1000, &mut bytes).unwrap();
        assert_eq!(bytes, [1, 2, 3], "the child does not see the parent's bytes");
        imported.write_at(2000, &[7, 8, 9]).unwrap();
        stream.send_with_handles(b"written", &[]).unwrap();
        // The parent closes first: the child's mapping outlives nothing it needs.
        let mut end = [0u8; 8];
        match stream.recv_with_handles(&mut end) {
            Ok((0, handles)) if handles.is_empty() => {}
            Err(Error::PeerGone(_)) => {}
            other => panic!("the parent said more than expected: {other:?}"),
        }
        return;
    }
    // Bound at a path, as the channels' rendezvous binds in the runtime directory.
    let path = std::env::temp_dir().join(test_child::unique("lf-export"));
    let listener = Listener::bind(&path).unwrap();
    let mut child = test_child::spawn(&test, "importer", &[("LF_TEST_PIPE", path.display().to_string())]);
    let stream = listener.accept(Some(Duration::from_secs(60))).unwrap();
    let context = context();
    let buffer = context.allocate(4096, crate::memory::MemoryLocation::CpuStandard).unwrap();
    buffer.write_at(1000, &[1, 2, 3]).unwrap();
    buffer.export().unwrap().send(&stream).unwrap();
    let mut said = [0u8; 16];
    let (n, handles) = stream.recv_with_handles(&mut said).unwrap();
    assert_eq!((&said[..n], handles.len()), (&b"written"[..], 0));
    let mut bytes = [0u8; 3];
    buffer.read_at(2000, &mut bytes).unwrap();
    assert_eq!(bytes, [7, 8, 9], "the parent does not see the child's bytes");
    drop(stream);
    assert!(child.wait().unwrap().success(), "the importing child failed");
}
