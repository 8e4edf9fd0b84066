//! The channel config (`lf_channel_config`) from `Channel`'s keywords, its role and its kind.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::error::{check, make};
use crate::ffi;
use crate::native::{lib, timeout_ns};

/// `lf_channel_config` with lava-flow's defaults (every config starts from the library's).
fn default_config() -> PyResult<ffi::lf_channel_config> {
    let mut c = ffi::lf_channel_config::default();
    // SAFETY: writable local (of the size given).
    #[cfg(lf_struct_size)]
    check(unsafe { lib().lf_channel_config_init(&mut c, std::mem::size_of_val(&c)) })?;
    #[cfg(not(lf_struct_size))]
    check(unsafe { lib().lf_channel_config_default(&mut c) })?;
    Ok(c)
}

/// `Channel`'s config keywords: each set one replaces lava-flow's default.
pub(super) struct ConfigKeywords {
    pub(super) capacity: Option<u32>,
    pub(super) pool_size: Option<u64>,
    pub(super) wait: Option<u32>,
    pub(super) spin_ns: Option<u64>,
    pub(super) rendezvous_timeout: Option<f64>,
    pub(super) auto_zero_copy: Option<bool>,
    pub(super) strict_gpu: Option<bool>,
    pub(super) released_semaphore: Option<bool>,
    pub(super) prefault: Option<bool>,
    pub(super) kind: Option<u32>,
    pub(super) max_peers: Option<u32>,
    pub(super) slow_consumer_timeout: Option<f64>,
}

impl ConfigKeywords {
    /// lava-flow's default config with the keywords given.
    pub(super) fn config(self) -> PyResult<ffi::lf_channel_config> {
        let ConfigKeywords {
            capacity,
            pool_size,
            wait,
            spin_ns,
            rendezvous_timeout,
            auto_zero_copy,
            strict_gpu,
            released_semaphore,
            prefault,
            kind,
            max_peers,
            slow_consumer_timeout,
        } = self;
        let mut c = default_config()?;
        if let Some(v) = capacity {
            c.capacity = v;
        }
        if let Some(v) = pool_size {
            c.pool_size = v;
        }
        if let Some(v) = wait {
            c.wait_strategy = v;
        }
        if let Some(v) = spin_ns {
            c.spin_ns = v;
        }
        if rendezvous_timeout.is_some() {
            c.rendezvous_timeout_ns = timeout_ns(rendezvous_timeout)?;
        }
        if let Some(v) = auto_zero_copy {
            c.auto_zero_copy = v as u32;
        }
        if let Some(v) = strict_gpu {
            c.strict_gpu = v as u32;
        }
        if let Some(v) = released_semaphore {
            c.released_semaphore = v as u32;
        }
        if let Some(v) = prefault {
            c.prefault = v as u32;
        }
        // The library checks these three at lf_channel_create, with its own messages.
        if let Some(v) = kind {
            c.kind = v;
        }
        if let Some(v) = max_peers {
            c.max_peers = v;
        }
        if slow_consumer_timeout.is_some() {
            c.slow_consumer_timeout_ns = timeout_ns(slow_consumer_timeout)?;
        }
        Ok(c)
    }
}

/// `role`: a `Role` (an int), "producer" or "consumer".
pub(super) fn role(role: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(r) = role.extract::<u32>() {
        return Ok(r);
    }
    match role.extract::<String>()?.as_str() {
        "producer" => Ok(ffi::LF_ROLE_PRODUCER),
        "consumer" => Ok(ffi::LF_ROLE_CONSUMER),
        other => Err(PyValueError::new_err(format!("role {other:?} is not \"producer\" or \"consumer\""))),
    }
}

/// `kind`: a `ChannelKind` (an int, checked by the library), "pair", "fan_in" or "fan_out".
pub(super) fn kind(kind: &Bound<'_, PyAny>) -> PyResult<u32> {
    if kind.is_instance_of::<PyInt>() {
        return kind.extract::<u32>();
    }
    match kind.extract::<String>()?.as_str() {
        "pair" => Ok(ffi::LF_CHANNEL_PAIR),
        "fan_in" => Ok(ffi::LF_CHANNEL_FAN_IN),
        "fan_out" => Ok(ffi::LF_CHANNEL_FAN_OUT),
        other => Err(make(
            ffi::LF_ERR_INVALID_ARGUMENT,
            "LF_ERR_INVALID_ARGUMENT",
            &format!(
                "kind {other:?} is not a channel kind: pass \"pair\", \"fan_in\" or \"fan_out\" (or a \
                 lava_flow.ChannelKind)"
            ),
        )),
    }
}
