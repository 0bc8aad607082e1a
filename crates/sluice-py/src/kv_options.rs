//! `sluice.kv` options and reports across the boundary: the options dict of `open` and
//! `connect` parsed in one place into a `KvConfig` / `KvClientConfig`, the defaults read
//! from Rust (`kv_defaults`), and the typed `stats` and `fsck` reports.
//!
//! Every option is a key of one dict; an unknown key, or a value of the wrong kind or out
//! of range (a negative count, a float where a whole number goes), is a `ConfigError`
//! naming it, never an `OverflowError` or a `TypeError` from the conversion.

use std::collections::HashSet;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use sluice_kv::{KvClientConfig, KvConfig, KvError, Namespace, RecomputeModel};
use sluice_policy::PolicyConfig;

use crate::config::{byte_size, integer, repr};
use crate::errors::config_error;

/// An options dict being read: each key is taken at most once, and [`Options::finish`]
/// refuses any key nobody took.
pub(crate) struct Options<'py> {
    dict: Bound<'py, PyDict>,
    taken: HashSet<&'static str>,
}

impl<'py> Options<'py> {
    pub(crate) fn new(dict: Bound<'py, PyDict>) -> Options<'py> {
        Options {
            dict,
            taken: HashSet::new(),
        }
    }

    /// The value of `key`; `None` when it is absent or None (the default then holds).
    fn value(&mut self, key: &'static str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.taken.insert(key);
        Ok(self.dict.get_item(key)?.filter(|v| !v.is_none()))
    }

    /// The value of `key` extracted as `T` (`what` names the kind, for the message).
    fn extract<T: for<'a> FromPyObject<'a, 'py>>(
        &mut self,
        key: &'static str,
        what: &str,
    ) -> PyResult<Option<T>> {
        let Some(v) = self.value(key)? else {
            return Ok(None);
        };
        v.extract::<T>()
            .map(Some)
            .map_err(|_| config_error(format!("kv: {key} must be {what}, not {}", repr(&v))))
    }

    fn string(&mut self, key: &'static str) -> PyResult<Option<String>> {
        self.extract(key, "a string")
    }

    /// A whole number that fits `T` (a count, milliseconds, a rank).
    fn whole<T: TryFrom<i128> + num_bounds::Bounds>(
        &mut self,
        key: &'static str,
    ) -> PyResult<Option<T>> {
        let Some(v) = self.value(key)? else {
            return Ok(None);
        };
        let range = || format!("a whole number from {} to {}", T::MIN, T::MAX);
        let Some(n) = integer(key, &v)? else {
            return Err(config_error(format!(
                "kv: {key} = {}: must be {}",
                repr(&v),
                range()
            )));
        };
        T::try_from(n)
            .map(Some)
            .map_err(|_| config_error(format!("kv: {key} = {n}: must be {}", range())))
    }

    fn size(&mut self, key: &'static str) -> PyResult<Option<u64>> {
        self.value(key)?.map(|v| byte_size(key, &v)).transpose()
    }

    fn float(&mut self, key: &'static str) -> PyResult<Option<f64>> {
        self.extract(key, "a number")
    }

    fn policy(&mut self, key: &'static str) -> PyResult<Option<PolicyConfig>> {
        let Some(spec) = self.string(key)? else {
            return Ok(None);
        };
        PolicyConfig::parse(&spec)
            .map(Some)
            .map_err(|e| config_error(format!("kv: {key} = {spec:?}: {e}")))
    }

    /// A named option (`write_mode`, `durability`, `direct`), parsed as the store names it.
    fn named<T: std::str::FromStr<Err = KvError>>(
        &mut self,
        key: &'static str,
    ) -> PyResult<Option<T>> {
        let Some(s) = self.string(key)? else {
            return Ok(None);
        };
        s.parse().map(Some).map_err(|e: KvError| match e {
            KvError::Config { expected, .. } => {
                config_error(format!("kv: {key} = {s:?}: {expected}"))
            }
            other => crate::errors::err(other),
        })
    }

    /// The namespace fields (model, dtype, tp_rank, tp_size, pp_stage, kv_format, salt).
    fn namespace(&mut self) -> PyResult<Namespace> {
        Ok(Namespace {
            model: self.string("model")?.unwrap_or_default(),
            dtype: self.string("dtype")?.unwrap_or_default(),
            tp_rank: self.whole("tp_rank")?.unwrap_or(0),
            tp_size: self.whole("tp_size")?.unwrap_or(1),
            pp_stage: self.whole("pp_stage")?.unwrap_or(0),
            kv_format: self.string("kv_format")?.unwrap_or_default(),
            salt: self.string("salt")?.unwrap_or_default(),
        })
    }

    /// `recompute_tokens_per_s` and `block_tokens`, which go together.
    fn recompute(&mut self) -> PyResult<Option<RecomputeModel>> {
        match (
            self.float("recompute_tokens_per_s")?,
            self.whole("block_tokens")?,
        ) {
            (None, None) => Ok(None),
            (Some(tokens_per_s), Some(block_tokens)) => Ok(Some(RecomputeModel {
                tokens_per_s,
                block_tokens,
            })),
            (rate, tokens) => Err(config_error(format!(
                "kv: recompute_tokens_per_s and block_tokens go together (got {rate:?} and \
                 {tokens:?})"
            ))),
        }
    }

    /// Refuses every key no option took, naming it and the known ones.
    pub(crate) fn finish(self) -> PyResult<()> {
        for key in self.dict.keys() {
            let key: String = key.extract()?;
            if !self.taken.contains(key.as_str()) {
                let mut known: Vec<&str> = self.taken.iter().copied().collect();
                known.sort_unstable();
                return Err(config_error(format!(
                    "kv: unknown option {key:?} (known: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// The store config an options dict describes (`sluice.kv.open`'s keyword arguments).
pub(crate) fn store_config(mut o: Options<'_>) -> PyResult<KvConfig> {
    let block_bytes = o
        .size("block_bytes")?
        .ok_or_else(|| config_error("kv: block_bytes is required"))?;
    let mut c = KvConfig::new(block_bytes, o.namespace()?);
    macro_rules! set {
        ($field:ident, $value:expr) => {
            if let Some(v) = $value {
                c.$field = v;
            }
        };
    }
    set!(dram_bytes, o.size("dram")?);
    set!(ssd_bytes, o.size("ssd")?);
    set!(dram_policy, o.policy("dram_policy")?);
    set!(ssd_policy, o.policy("ssd_policy")?);
    set!(write_mode, o.named("write_mode")?);
    set!(durability, o.named("durability")?);
    set!(direct, o.named("direct")?);
    if let Some(e) = o.string("engine")? {
        c.engine = e
            .parse()
            .map_err(|why| config_error(format!("kv: engine = {e:?}: {why}")))?;
    }
    set!(io_threads, o.whole("io_threads")?);
    set!(lease_timeout_ms, o.whole("lease_timeout_ms")?);
    c.key_bytes = o.whole("key_bytes")?;
    set!(segment_bytes, o.size("segment_bytes")?);
    c.recompute = o.recompute()?;
    c.shared_dir = o.string("shared_dir")?.map(PathBuf::from);
    set!(shared_bytes, o.size("shared")?);
    set!(shared_policy, o.policy("shared_policy")?);
    set!(shared_refresh_ms, o.whole("shared_refresh_ms")?);
    c.remote = o.string("remote")?;
    set!(remote_timeout_ms, o.whole("remote_timeout_ms")?);
    o.finish()?;
    Ok(c)
}

/// The client config an options dict describes (`sluice.kv.connect`'s keyword arguments).
pub(crate) fn client_config(mut o: Options<'_>) -> PyResult<KvClientConfig> {
    let mut c = KvClientConfig::new(o.namespace()?);
    if let Some(v) = o.size("shm")? {
        c.shm_bytes = v;
    }
    if let Some(v) = o.whole("connections")? {
        c.connections = v;
    }
    if let Some(v) = o.whole("retry_ms")? {
        c.retry_ms = v;
    }
    if let Some(v) = o.whole("timeout_ms")? {
        c.timeout_ms = v;
    }
    c.recompute = o.recompute()?;
    o.finish()?;
    Ok(c)
}

/// The bounds of the integer types an option converts to, for messages.
mod num_bounds {
    pub trait Bounds: std::fmt::Display {
        const MIN: Self;
        const MAX: Self;
    }
    macro_rules! bounds {
        ($($t:ty),*) => {$(
            impl Bounds for $t {
                const MIN: Self = <$t>::MIN;
                const MAX: Self = <$t>::MAX;
            }
        )*};
    }
    bounds!(u32, u64, usize);
}

/// Every default of `open`, `connect` and `sluice kv serve`, from Rust
/// (`sluice_kv::kv_defaults`), as a dict.
#[pyfunction]
pub fn kv_defaults(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let value = serde_json::to_value(sluice_kv::kv_defaults()).unwrap_or_default();
    json_to_py(py, &value)
}

/// A JSON value as the Python object `json.loads` would give.
pub(crate) fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any().unbind(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any().unbind(),
            _ => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, json_to_py(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

/// The counters of a store or a sidecar connection (`KvStore.stats()`): the main ones as
/// attributes, all of them (per tier, the load model, a connection's client and server
/// parts) as the dict `to_dict()` returns, which is what `sluice.kv` hands its callers.
#[pyclass(name = "KvStatsReport", module = "sluice._sluice", frozen)]
pub struct KvStatsReport {
    #[pyo3(get)]
    puts: u64,
    #[pyo3(get)]
    put_failures: u64,
    #[pyo3(get)]
    put_declined: u64,
    #[pyo3(get)]
    gets: u64,
    #[pyo3(get)]
    hits_dram: u64,
    #[pyo3(get)]
    hits_ssd: u64,
    #[pyo3(get)]
    misses: u64,
    #[pyo3(get)]
    corrupt_blocks: u64,
    report: serde_json::Value,
}

impl KvStatsReport {
    pub(crate) fn new(report: serde_json::Value) -> KvStatsReport {
        let n = |key: &str| report.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        KvStatsReport {
            puts: n("puts"),
            put_failures: n("put_failures"),
            put_declined: n("put_declined"),
            gets: n("gets"),
            hits_dram: n("hits_dram"),
            hits_ssd: n("hits_ssd"),
            misses: n("misses"),
            corrupt_blocks: n("corrupt_blocks"),
            report,
        }
    }
}

#[pymethods]
impl KvStatsReport {
    /// Everything, as a dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        json_to_py(py, &self.report)
    }
}

/// What `fsck` found (`sluice.kv.fsck`, `sluice kv fsck`); `to_dict()` adds the problems
/// (segment, slot, detail). `lock` says how the store was held while it was checked
/// ("exclusive", "shared (read-only)", or "none: <why>").
#[pyclass(name = "KvFsckReport", module = "sluice._sluice", frozen)]
pub struct KvFsckReport {
    #[pyo3(get)]
    segments: u64,
    #[pyo3(get)]
    good_blocks: u64,
    #[pyo3(get)]
    bad_blocks: u64,
    #[pyo3(get)]
    bad_segments: u64,
    #[pyo3(get)]
    bytes_verified: u64,
    #[pyo3(get)]
    repaired: bool,
    #[pyo3(get)]
    lock: String,
    report: serde_json::Value,
}

impl KvFsckReport {
    pub(crate) fn new(r: sluice_kv::FsckReport) -> KvFsckReport {
        KvFsckReport {
            segments: r.segments,
            good_blocks: r.good_blocks,
            bad_blocks: r.bad_blocks,
            bad_segments: r.bad_segments,
            bytes_verified: r.bytes_verified,
            repaired: r.repaired,
            lock: r.lock.clone(),
            report: serde_json::to_value(&r).unwrap_or_default(),
        }
    }
}

#[pymethods]
impl KvFsckReport {
    /// Everything, problems included, as a dict.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        json_to_py(py, &self.report)
    }
}
