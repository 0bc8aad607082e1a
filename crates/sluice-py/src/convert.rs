//! Rust reports into Python objects: any `Serialize` report becomes the dicts, lists,
//! ints, floats, strings and `None` its serde form describes (typed in `_sluice.pyi` as
//! `TypedDict`s), never a JSON string the caller has to parse again.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::Serialize;

/// `report` as a Python object.
pub fn to_py<'py, T: Serialize>(py: Python<'py>, report: &T) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(report).expect("reports always serialize");
    value_to_py(py, &value)
}

fn value_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (_, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (_, _, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, value_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
