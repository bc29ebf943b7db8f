//! `CallableModel`: a model given as a Python callable from the context to the next-token
//! logits, as a [`LanguageModel`] whose token loop runs in Rust (its Python methods are in
//! `decoding.rs`).

use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::errors::IntoPyResult;
use crate::decode::LanguageModel;
use crate::error::{Error, Result};

/// A model given as a Python callable from the context (a list of ids) to the next-token
/// logits (see `reprolm.CallableModel`).
#[pyclass(frozen, name = "CallableModel", module = "reprolm._core")]
pub struct PyCallableModel {
    pub(super) function: Py<PyAny>,
    pub(super) vocab_size: usize,
    pub(super) eos_id: Option<u32>,
}

/// The [`LanguageModel`] that calls back into Python: the GIL is taken for each call only.
/// An exception raised by the callable is kept in `error` (the decoder sees a placeholder
/// error and stops) and re-raised as it is.
pub(super) struct Callback<'a> {
    pub(super) model: &'a PyCallableModel,
    pub(super) error: Option<PyErr>,
}

impl Callback<'_> {
    /// Calls the function; `Err` is a Python exception, `Ok(Err)` a bad return value.
    fn call(&self, py: Python<'_>, context: &[u32]) -> PyResult<Result<Vec<f32>>> {
        let returned = self.model.function.bind(py).call1((PyList::new(py, context)?,))?;
        let values: Vec<f64> = if let Ok(array) = returned.extract::<PyReadonlyArray1<'_, f32>>() {
            array.as_array().iter().map(|&v| v as f64).collect()
        } else if let Ok(array) = returned.extract::<PyReadonlyArray1<'_, f64>>() {
            array.as_array().to_vec()
        } else {
            match returned.extract::<Vec<f64>>() {
                Ok(values) => values,
                Err(_) => {
                    let shape = returned
                        .cast::<numpy::PyUntypedArray>()
                        .map(|a| format!(" of shape {:?} and dtype {}", a.shape(), a.dtype()))
                        .unwrap_or_default();
                    return Err(PyTypeError::new_err(format!(
                        "the model function must return a 1-D sequence of floats (the logits), got {}{shape}",
                        returned.get_type().name()?
                    )));
                }
            }
        };
        Ok(to_logits(&values, self.model.vocab_size))
    }
}

/// Checks the length and values of the returned logits and rounds them to float32, the
/// precision of a model's logits. -inf is a token of probability 0; NaN, +inf and finite
/// values beyond the float32 range are rejected.
fn to_logits(values: &[f64], vocab_size: usize) -> Result<Vec<f32>> {
    if values.len() != vocab_size {
        return Err(Error::invalid_argument(
            "logits",
            format!("the model function returned {} logits for a vocabulary of {vocab_size}", values.len()),
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(id, &v)| {
            let rounded = v as f32;
            if v.is_nan() || v == f64::INFINITY {
                Err(Error::invalid_argument("logits", format!("entry {id} returned by the model function is {v}")))
            } else if v.is_finite() && rounded.is_infinite() {
                Err(Error::invalid_argument("logits", format!("entry {id} ({v}) is outside the float32 range")))
            } else {
                Ok(rounded)
            }
        })
        .collect()
}

impl LanguageModel for Callback<'_> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size
    }

    fn eos_id(&self) -> Option<u32> {
        self.model.eos_id
    }

    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        match Python::attach(|py| self.call(py, context)) {
            Ok(result) => result,
            Err(error) => {
                self.error = Some(error);
                Err(Error::invalid_argument("fn", "the model function raised an exception"))
            }
        }
    }
}

impl PyCallableModel {
    /// Runs `decode` over this model with the GIL released between callbacks; a Python
    /// exception from the callable wins over the error it caused.
    pub(super) fn run<T: Send>(
        &self,
        py: Python<'_>,
        decode: impl FnOnce(&mut Callback<'_>) -> Result<T> + Send,
    ) -> PyResult<T> {
        let mut callback = Callback { model: self, error: None };
        let result = py.detach(|| decode(&mut callback));
        match callback.error.take() {
            Some(error) => Err(error),
            None => result.py(),
        }
    }
}
