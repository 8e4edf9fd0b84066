//! The Rust API of `lava_flow::mpi` in a singleton MPI process (started without mpirun):
//! lava-flow initialises MPI, discovers itself, and finalizes MPI with its last world. The
//! runs with several processes are the C tests under mpirun (tests/c/test_mpi.c).
//!
//! One test in this binary on purpose: MPI can be initialised once per process.
#![cfg(feature = "mpi")]

use lava_flow::mpi::{Communicator, MpiWorld, ThreadLevel};
use lava_flow::{detect_scope, CommunicationScope, Error, ProcessLocation};

#[test]
fn a_singleton_joins_discovers_itself_and_finalizes_mpi() {
    let world = MpiWorld::join(Communicator::World, Some("solo")).expect("join a singleton MPI world");
    assert_eq!((world.size(), world.rank()), (1, 0));
    assert!(world.initialised_mpi(), "nothing else initialised MPI here");
    assert!(world.thread_level() >= ThreadLevel::Single);
    println!("thread level {}, tag upper bound {}", world.thread_level(), world.tag_upper_bound());
    assert!(world.tag_upper_bound() >= 32767);
    assert_eq!(world.topology_report(), "");

    assert_eq!(world.rank_of("solo").unwrap(), 0);
    assert!(matches!(world.rank_of("other"), Err(Error::NotFound(m)) if m.contains("they are: solo")));
    assert!(matches!(world.rank_of("no way"), Err(Error::InvalidArgument(_))));
    assert!(matches!(world.peer(1), Err(Error::InvalidArgument(m)) if m.contains("ranks 0 to 0")));
    let me = world.me();
    assert_eq!(me.name().as_str(), "solo");
    let here = ProcessLocation::from_hostname().unwrap();
    assert_eq!(me.location().hostname, here.hostname);
    assert_eq!(me.location().host_id, here.host_id);
    assert!(me.location().host_id.is_some());
    assert_eq!(detect_scope(me.location(), &here), CommunicationScope::Local);
    assert_eq!(me.shared_memory_group(), 0);

    // A second world alongside; its default name is the rank.
    let second = MpiWorld::join(Communicator::World, None).unwrap();
    assert_eq!(second.me().name().as_str(), "rank0");
    // A communicator handle that names nothing is refused, and the worlds live on.
    assert!(matches!(MpiWorld::join(Communicator::Fortran(1 << 20), None), Err(Error::InvalidArgument(_))));
    drop(world);
    assert_eq!(second.size(), 1);
    drop(second);

    // The last world finalized MPI, which cannot start again.
    let err = MpiWorld::join(Communicator::World, None).unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    assert!(err.to_string().contains("cannot be initialised twice"), "{err}");
}
