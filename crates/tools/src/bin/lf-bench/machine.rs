//! What every lf-bench report opens with: the machine it ran on, when, and with what build.

use serde_json::{json, Value};

/// The machine and the run, read from the system at the start of the run.
pub struct Machine {
    pub cpu: String,
    pub cpus_online: usize,
    /// The cores this process may run on before lf-bench pins itself.
    pub cpus_allowed: usize,
    pub kernel: String,
    pub os: String,
    pub memory_gib: f64,
    pub load_average: String,
    pub unix_time_s: u64,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `key: value` of /proc/cpuinfo's first processor (`model name` on x86, else what there is).
fn cpu_model() -> String {
    let info = read("/proc/cpuinfo");
    for key in ["model name", "Model", "cpu model", "Hardware"] {
        let found = info.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        });
        if let Some(v) = found.filter(|v| !v.is_empty()) {
            return v;
        }
    }
    "unknown".to_owned()
}

fn kernel() -> String {
    // SAFETY: utsname is plain data that uname fills; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".to_owned();
        }
        let field = |f: &[libc::c_char]| std::ffi::CStr::from_ptr(f.as_ptr()).to_string_lossy().into_owned();
        format!("{} {} {}", field(&u.sysname), field(&u.release), field(&u.machine))
    }
}

fn os_name() -> String {
    read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn memory_gib() -> f64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / (1 << 20) as f64)
}

fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 0;
        }
        libc::CPU_COUNT(&set) as usize
    }
}

/// `2026-11-23 02:14:32 UTC` from seconds since the epoch (days to a civil date: Howard
/// Hinnant's algorithm).
pub fn utc(unix_s: u64) -> String {
    let (days, secs) = ((unix_s / 86_400) as i64, unix_s % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", secs / 3600, secs / 60 % 60, secs % 60)
}

impl Machine {
    pub fn probe() -> Machine {
        // SAFETY: sysconf takes an integer.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        Machine {
            cpu: cpu_model(),
            cpus_online: online,
            cpus_allowed: cpus_allowed(),
            kernel: kernel(),
            os: os_name(),
            memory_gib: memory_gib(),
            load_average: read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
            unix_time_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        }
    }

    /// The configuration lines about the machine and the build (without `# `).
    pub fn lines(&self) -> Vec<String> {
        vec![
            format!("Date: {}", utc(self.unix_time_s)),
            format!("Command: {}", command()),
            format!(
                "lava-flow {} (lf-bench, {} build)",
                env!("CARGO_PKG_VERSION"),
                if cfg!(debug_assertions) { "debug" } else { "release" }
            ),
            format!("CPU: {}, {} online, {} allowed to lf-bench", self.cpu, self.cpus_online, self.cpus_allowed),
            format!("Memory: {:.1} GiB; OS: {}; kernel: {}", self.memory_gib, self.os, self.kernel),
            format!("Load average at the start: {}", self.load_average),
        ]
    }

    pub fn to_json(&self) -> Value {
        json!({
            "date_utc": utc(self.unix_time_s),
            "unix_time_s": self.unix_time_s,
            "command": command(),
            "lava_flow_version": env!("CARGO_PKG_VERSION"),
            "build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "cpu": self.cpu,
            "cpus_online": self.cpus_online,
            "cpus_allowed": self.cpus_allowed,
            "memory_gib": self.memory_gib,
            "os": self.os,
            "kernel": self.kernel,
            "load_average_start": self.load_average,
        })
    }
}

/// The command line lf-bench was started with.
pub fn command() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_795_400_072), "2026-11-23 02:14:32 UTC");
    }
}
