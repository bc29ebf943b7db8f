//! Bindings for the quantization tool (`reprolm.quantize`, `reprolm.convert`,
//! `reprolm.quantize_row`); the Python side builds the report dataclasses from these tuples.

use std::path::PathBuf;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::IntoPyResult;
use crate::error::Error;
use crate::quantize::{encode_row, QuantizeOptions, RowError, TensorReport};

/// (name, type, dims,
///  (n_values, n_over_bound, n_outside, n_clipped),
///  (step, max_step, max_abs_error, worst_bound_ratio, frobenius_error, frobenius_bound, frobenius_estimate))
type TensorTuple = (String, String, Vec<u64>, (u64, u64, u64, u64), (f64, f64, f64, f64, f64, f64, f64));

fn tensor_tuple(t: &TensorReport) -> TensorTuple {
    let s = &t.stats;
    (
        t.name.clone(),
        t.ggml_type.name().to_string(),
        t.dims.clone(),
        (s.n_values, s.n_over_bound, s.n_outside, t.n_clipped),
        (
            s.step(),
            s.max_step,
            s.max_abs_error,
            s.worst_bound_ratio,
            s.frobenius_error(),
            s.frobenius_bound(),
            s.frobenius_estimate(),
        ),
    )
}

/// Quantizes a GGUF file: ([tensor tuple], (mean KL, max KL, positions) or None).
#[pyfunction]
#[pyo3(signature = (src, dst, *, weight_type, scheme, clip, output_type, report_text))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn quantize(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    weight_type: &str,
    scheme: &str,
    clip: Option<f64>,
    output_type: Option<&str>,
    report_text: Option<String>,
) -> PyResult<(Vec<TensorTuple>, Option<(f64, f64, usize)>)> {
    let options = QuantizeOptions::parse(weight_type, scheme, clip, output_type, report_text).py()?;
    let report = py.detach(|| crate::quantize::quantize_file(&src, &dst, &options)).py()?;
    Ok((report.tensors.iter().map(tensor_tuple).collect(), report.kl.map(|k| (k.mean, k.max, k.n_positions))))
}

/// Writes a dequantized copy of a GGUF file (matrices as `to`, vectors as F32).
#[pyfunction]
#[pyo3(signature = (src, dst, *, to))]
fn convert(py: Python<'_>, src: PathBuf, dst: PathBuf, to: &str) -> PyResult<()> {
    let to = crate::quantize::parse_convert_type(to).py()?;
    py.detach(|| crate::quantize::convert_file(&src, &dst, to)).py()
}

/// Encodes float32 values (a multiple of the block size) as raw ggml bytes of `weight_type`.
#[pyfunction]
#[pyo3(signature = (values, *, weight_type, scheme, clip))]
fn quantize_row<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f32>,
    weight_type: &str,
    scheme: &str,
    clip: Option<f64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let options = QuantizeOptions::parse(weight_type, scheme, clip, None, None).py()?;
    let x = values.as_slice().map_err(|_| Error::invalid_argument("values", "must be a contiguous array")).py()?;
    let ty = options.weight_type;
    if x.len() % ty.block_size() != 0 {
        return Err(Error::invalid_argument(
            "values",
            format!("{} values are not whole blocks of {} for {}", x.len(), ty.block_size(), ty.name()),
        ))
        .py();
    }
    let mut out = vec![0u8; ty.row_bytes(x.len())];
    py.detach(|| encode_row(ty, options.scheme, x, &mut out))
        .map_err(|e| match e {
            RowError::NonFinite(i) => Error::invalid_argument("values", format!("value {i} is not finite")),
            RowError::Overflow => Error::invalid_argument("values", format!("beyond the f16 scales of {}", ty.name())),
        })
        .py()?;
    Ok(PyBytes::new(py, &out))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_row, m)?)?;
    Ok(())
}
