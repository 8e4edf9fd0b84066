//! Every `LF_*` environment variable lava-flow reads, in one table: its name, its default and
//! what it does. The code that reads a variable takes its name from here (each module's
//! `*_ENV` constant is the table entry's name), and `lf-info -c` prints the table with the
//! values this process sees, so the list cannot drift from what the library reads. A test
//! checks that every `"LF_..."` name in the library's sources is in the table.
//!
//! ```
//! for setting in lava_flow::env::settings() {
//!     println!("{} = {} ({})", setting.var.name, setting.value(), setting.source);
//! }
//! ```

use std::fmt;

/// One environment variable lava-flow reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvVar {
    pub name: &'static str,
    /// The value that applies when the variable is unset (or empty), in words where it is
    /// not one value.
    pub default: &'static str,
    /// What it does, and the values it takes.
    pub meaning: &'static str,
    /// The cargo feature a build needs for the variable to have an effect (`None`: every build).
    pub feature: Option<&'static str>,
}

/// `LF_VULKAN_DEVICE`: which Vulkan device a context opens.
pub const VULKAN_DEVICE: EnvVar = EnvVar {
    name: "LF_VULKAN_DEVICE",
    default: "unset: the first discrete GPU, else the first device",
    meaning: "the Vulkan device a context opens when its config names none: a device index (0, 1, ... as \
              `vulkaninfo --summary` lists them) or a deviceUUID (32 hex digits, dashes allowed)",
    feature: Some("vulkan"),
};

/// `LF_GPU_COPY`: how copies between GPU buffers are made.
pub const GPU_COPY: EnvVar = EnvVar {
    name: "LF_GPU_COPY",
    default: "auto",
    meaning: "how copies between GPU buffers are made: auto (CUDA where the process uses CUDA on the GPU, else \
              a compute shader for large copies on GPUs and the copy engine otherwise), engine, shader or cuda; \
              read when a device opens",
    feature: Some("vulkan"),
};

/// `LF_COPY_THREADS`: how many threads make large host copies.
pub const COPY_THREADS: EnvVar = EnvVar {
    name: "LF_COPY_THREADS",
    default: "8, at most the cores this process may use",
    meaning: "how many threads make large host copies, the calling thread included (1: the calling thread \
              alone): those of GPU transfers, and the copy a send makes of a message of 512 KiB or more into a \
              shared-memory channel (where the process may run on 4 cores or more, or wherever this is set)",
    feature: None,
};

/// `LF_DISABLE_CUDA`: keeps lava-flow from loading the CUDA driver.
pub const DISABLE_CUDA: EnvVar = EnvVar {
    name: "LF_DISABLE_CUDA",
    default: "unset: lava-flow uses the CUDA driver where it is installed",
    meaning: "1 keeps lava-flow from loading the CUDA driver (libcuda.so.1), which it uses to recognise CUDA \
              memory the application registers (in a process that has loaded CUDA itself), to register GPU-pinned \
              memory with CUDA and to copy between GPU buffers by CUDA",
    feature: None,
};

/// `LF_TRANSPORTS`: the transports channels may use.
pub const TRANSPORTS: EnvVar = EnvVar {
    name: "LF_TRANSPORTS",
    default: "unset: every transport this build has that reaches another process (shm, vulkan_ipc, mpi, cuda_ipc)",
    meaning: "the transports channels may use, in order of preference, comma-separated (like UCX_TLS): shm, \
              vulkan_ipc, cuda_ipc, mpi, loopback (both ends threads of one process, only when named); a channel \
              that none of them can carry fails, saying why",
    feature: None,
};

/// `LF_RUNTIME_DIR`: where channels meet.
pub const RUNTIME_DIR: EnvVar = EnvVar {
    name: "LF_RUNTIME_DIR",
    default: "$XDG_RUNTIME_DIR/lava-flow, else /tmp/lava-flow-$UID",
    meaning: "the directory holding the channels' rendezvous sockets and lock files (0700, owned by the user); \
              processes meet only if they use the same one",
    feature: None,
};

/// `LF_HOST_ID`: which host this process is on.
pub const HOST_ID: EnvVar = EnvVar {
    name: "LF_HOST_ID",
    default: "detected: the boot id and the UTS, IPC and network namespaces",
    meaning: "this process's host identity: processes with equal identities are on one host and share memory \
              (scope local); set it to group containers that can share memory, or to simulate hosts",
    feature: None,
};

/// `LF_PROCESS_NAME`: this process's name in MPI discovery.
pub const PROCESS_NAME: EnvVar = EnvVar {
    name: "LF_PROCESS_NAME",
    default: "rank<N>, N being the MPI rank",
    meaning: "this process's name in MPI discovery when the join names none (letters, digits, '-', '_', '.')",
    feature: Some("mpi"),
};

/// `LF_MPI`: whether a context joins MPI by itself under an MPI launcher.
pub const MPI: EnvVar = EnvVar {
    name: "LF_MPI",
    default: "auto",
    meaning: "auto: under an MPI launcher (mpirun, mpiexec, srun), creating a context joins MPI_COMM_WORLD, a \
              collective every rank must make, so that locations from a config file reach peers on other hosts; \
              off: only lf_mpi_join joins",
    feature: Some("mpi"),
};

/// `LF_LOG_LEVEL`: how much lava-flow logs.
pub const LOG_LEVEL: EnvVar = EnvVar {
    name: "LF_LOG_LEVEL",
    default: "warn",
    meaning: "how much lava-flow logs to stderr: off, error, warn, info, debug or trace",
    feature: None,
};

/// Every variable, in the order `lf-info -c` lists them.
pub const VARS: &[EnvVar] = &[
    VULKAN_DEVICE,
    GPU_COPY,
    COPY_THREADS,
    DISABLE_CUDA,
    TRANSPORTS,
    RUNTIME_DIR,
    HOST_ID,
    PROCESS_NAME,
    MPI,
    LOG_LEVEL,
];

/// The variable called `name`, if lava-flow reads it.
pub fn lookup(name: &str) -> Option<&'static EnvVar> {
    VARS.iter().find(|v| v.name == name)
}

/// Where a setting's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Unset (or empty): the default applies.
    Default,
    /// Set in this process's environment.
    Environment,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Environment => "environment",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One variable as this process sees it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub var: &'static EnvVar,
    /// The environment's value, when set and not empty (lossily decoded if it is not UTF-8).
    pub env_value: Option<String>,
    pub source: Source,
}

impl Setting {
    /// The value that applies: the environment's, else the default.
    pub fn value(&self) -> &str {
        self.env_value.as_deref().unwrap_or(self.var.default)
    }
}

/// How `var` is set in this process now. An empty value counts as unset, as it does
/// wherever lava-flow reads one.
pub fn setting(var: &'static EnvVar) -> Setting {
    let env_value = std::env::var_os(var.name).filter(|v| !v.is_empty()).map(|v| v.to_string_lossy().into_owned());
    let source = if env_value.is_some() { Source::Environment } else { Source::Default };
    Setting { var, env_value, source }
}

/// Every variable of [`VARS`] as this process sees it now.
pub fn settings() -> Vec<Setting> {
    VARS.iter().map(setting).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// Names that appear as `"LF_..."` literals in the library's sources without being
    /// variables a user sets, each with the reason.
    const NOT_USER_SETTINGS: &[(&str, &str)] = &[
        ("LF_FUZZ_CASES", "read by the library's own property tests only"),
        ("LF_WINDOWS_TEST_CHILD", "set by the Windows platform layer's tests for the children they spawn"),
        ("LF_TEST_LOCK", "set by the Windows platform layer's lock test for its child"),
        ("LF_TEST_PIPE", "set by the Windows platform layer's stream tests for their children"),
        ("LF_TEST_CHANNEL", "set by the Windows channel tests for their children: the channel to meet on"),
        ("LF_REQUIRE_VULKAN", "read by the tests only: they fail instead of skipping without a Vulkan device"),
        ("LF_REQUIRE_MPI", "read by the tests only: they fail instead of skipping where mpirun cannot start"),
        ("LF_TEST_SIGNALS", "set by the MPI tests for their ranks: a folder for signals that must not go through MPI"),
        (
            "LF_TEST_FAKE_CUDA_IPC",
            "read only with the test-hooks feature: the CUDA route's tests run it on a stand-in for the driver",
        ),
    ];

    /// The library's sources but this table (the C API, in crates/c-api, reads no variable of
    /// its own; the tools in crates/tools read theirs, LF_BENCH_*).
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("src/env.rs") {
                out.push(path);
            }
        }
    }

    /// The names the C header defines (`#define LF_X` and enum values `LF_X = N`): constants
    /// of the C API, not variables, when a source spells one out.
    fn c_api_names() -> BTreeSet<String> {
        let header =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/lava_flow.h")).unwrap();
        let mut names = BTreeSet::new();
        for line in header.lines().map(str::trim) {
            let name = line.strip_prefix("#define ").unwrap_or(line);
            let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
            let (name, rest) = name.split_at(end);
            if name.starts_with("LF_") && (line.starts_with("#define ") || rest.trim_start().starts_with('=')) {
                names.insert(name.to_owned());
            }
        }
        assert!(
            names.contains("LF_ERR_TIMEOUT") && names.contains("LF_GPU_DEVICE_UUID"),
            "the header scan found {names:?}"
        );
        names
    }

    /// Every string literal that is exactly an `LF_` name (`"LF_GPU_COPY"`) in the library's
    /// sources, but the C API's constants; status texts (`"LF_OK: success"`) and the bare
    /// prefix are not names.
    fn names_in_sources() -> BTreeSet<String> {
        let constants = c_api_names();
        let mut files = Vec::new();
        rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        assert!(files.len() > 20, "found only {} source files", files.len());
        let mut names = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices("\"LF_") {
                let rest = &text[at + 1..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..len];
                if rest[len..].starts_with('"') && name.len() > "LF_".len() && !constants.contains(name) {
                    names.insert(name.to_owned());
                }
            }
        }
        names
    }

    #[test]
    fn every_variable_named_in_the_sources_is_in_the_table() {
        let names = names_in_sources();
        // The scan works: it finds the test-only name.
        assert!(names.contains("LF_FUZZ_CASES"), "{names:?}");
        let exempt: BTreeSet<&str> = NOT_USER_SETTINGS.iter().map(|(n, _)| *n).collect();
        let missing: Vec<&String> =
            names.iter().filter(|n| lookup(n).is_none() && !exempt.contains(n.as_str())).collect();
        assert!(
            missing.is_empty(),
            "add these to lava_flow::env::VARS (src/env.rs) and read them through it: {missing:?}"
        );
        for (name, _) in NOT_USER_SETTINGS {
            assert!(names.contains(*name), "{name} is exempt but no source names it any more: drop it from the list");
        }
    }

    /// Each module's name for its variable is the table's, and every entry of the table is
    /// some module's (or says where it is read).
    // It names the channels' variables, and channels are built on Unix only so far.
    #[cfg(unix)]
    #[test]
    fn every_table_entry_is_read_by_a_module() {
        #[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
        let mut read: Vec<(&str, &EnvVar)> = vec![
            (crate::channels::TRANSPORTS_ENV, &TRANSPORTS),
            (crate::channels::RUNTIME_DIR_ENV, &RUNTIME_DIR),
            (crate::types::HOST_ID_ENV, &HOST_ID),
            (crate::mpi::PROCESS_NAME_ENV, &PROCESS_NAME),
            (crate::mpi::MPI_ENV, &MPI),
            (crate::logging::LOG_LEVEL_ENV, &LOG_LEVEL),
            (crate::memory::COPY_THREADS_ENV, &COPY_THREADS),
            (lava_flow_cuda::DISABLE_CUDA_ENV, &DISABLE_CUDA),
        ];
        #[cfg(feature = "vulkan")]
        {
            use crate::memory::gpu;
            read.extend([(gpu::DEVICE_ENV, &VULKAN_DEVICE), (gpu::GPU_COPY_ENV, &GPU_COPY)]);
        }
        for (module_name, var) in &read {
            assert_eq!(module_name, &var.name);
        }
        for var in VARS {
            let covered = read.iter().any(|(_, v)| v.name == var.name)
                || (cfg!(not(feature = "vulkan")) && var.feature == Some("vulkan"));
            assert!(
                covered,
                "{} is in the table but no module reads it: drop it, or add its module's name here",
                var.name
            );
        }
    }

    #[test]
    fn names_are_unique_and_settings_say_where_they_come_from() {
        let unique: BTreeSet<&str> = VARS.iter().map(|v| v.name).collect();
        assert_eq!(unique.len(), VARS.len());
        assert!(VARS.iter().all(|v| v.name.starts_with("LF_") && !v.default.is_empty() && !v.meaning.is_empty()));
        assert_eq!(lookup("LF_NO_SUCH_THING"), None);
        // A variable no test sets: its default, from the default.
        if std::env::var_os(LOG_LEVEL.name).is_none() {
            let s = setting(&LOG_LEVEL);
            assert_eq!((s.value(), s.source), ("warn", Source::Default));
        }
        assert_eq!(settings().len(), VARS.len());
    }
}
