//! The `Session` binding: one sequence with its KV cache (see `reprolm.Session`).

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::PyArray1;
use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::sampling::PySamplerConfig;
use super::{finish_reason_name, token_ids, PyEngine};
use crate::engine::{Session, SessionOptions};
use crate::error::Error;
use crate::model::{KvDtype, Overflow};
use crate::sampling::Sampler;

/// One sequence with its KV cache.
#[pyclass(frozen, name = "Session", module = "reprolm._core")]
pub struct PySession {
    session: Mutex<Session>,
}

impl PySession {
    fn lock(&self) -> MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn non_negative(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_argument(name, format!("must be >= 0, got {v}"))).py()
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (engine, *, context_length=None, kv_dtype="f32", overflow="error", n_keep=4))]
    fn new(
        py: Python<'_>,
        engine: &PyEngine,
        context_length: Option<i64>,
        kv_dtype: &str,
        overflow: &str,
        n_keep: i64,
    ) -> PyResult<Self> {
        let context_length = match context_length {
            None => None,
            Some(n) => Some(
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| Error::invalid_argument("context_length", format!("must be >= 1, got {n}")))
                    .py()?,
            ),
        };
        let options = SessionOptions {
            context_length,
            kv_dtype: KvDtype::parse(kv_dtype).py()?,
            overflow: Overflow::parse(overflow, non_negative("n_keep", n_keep)?).py()?,
        };
        let engine = Arc::clone(&engine.engine);
        let session = py.detach(|| Session::with_options(engine, &options)).py()?;
        Ok(PySession { session: Mutex::new(session) })
    }

    /// Restores a session saved with `save` for this engine's model.
    #[staticmethod]
    fn load(py: Python<'_>, engine: &PyEngine, path: std::path::PathBuf) -> PyResult<Self> {
        let engine = Arc::clone(&engine.engine);
        let session = py.detach(|| Session::load(engine, &path)).py()?;
        Ok(PySession { session: Mutex::new(session) })
    }

    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| self.lock().save(&path)).py()
    }

    #[getter]
    fn tokens(&self) -> Vec<u32> {
        self.lock().tokens().to_vec()
    }

    #[getter]
    fn context_length(&self) -> usize {
        self.lock().capacity()
    }

    #[getter]
    fn kv_dtype(&self) -> &'static str {
        self.lock().cache().dtype().name()
    }

    #[getter]
    fn overflow(&self) -> &'static str {
        self.lock().cache().overflow().name()
    }

    #[getter]
    fn n_keep(&self) -> usize {
        self.lock().cache().overflow().n_keep()
    }

    #[getter]
    fn kv_bytes(&self) -> usize {
        self.lock().kv_bytes()
    }

    /// Appends `ids`; the logits after the last one (float32, vocab_size).
    fn feed<'py>(&self, py: Python<'py>, ids: Vec<i64>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let engine = Arc::clone(self.lock().engine());
        let ids = token_ids(&engine, ids)?;
        let logits = py.detach(|| self.lock().feed(&ids).map(<[f32]>::to_vec)).py()?;
        Ok(PyArray1::from_vec(py, logits))
    }

    fn truncate(&self, n: i64) -> PyResult<()> {
        let n = non_negative("n", n)?;
        self.lock().truncate(n);
        Ok(())
    }

    /// Generates from `ids` (the whole context), reusing the cached shared prefix:
    /// (generated ids, finish reason).
    #[pyo3(signature = (ids, *, max_tokens, sampler, stop_token_ids))]
    fn generate(
        &self,
        py: Python<'_>,
        ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
    ) -> PyResult<(Vec<u32>, &'static str)> {
        let engine = Arc::clone(self.lock().engine());
        let ids = token_ids(&engine, ids)?;
        let stop = token_ids(&engine, stop_token_ids)?;
        let max_tokens = non_negative("max_tokens", max_tokens)?;
        let mut sampler = Sampler::new(sampler.config.clone(), engine.config().vocab_size).py()?;
        let generation = py.detach(|| self.lock().generate(&ids, &mut sampler, max_tokens, &stop)).py()?;
        Ok((generation.ids, finish_reason_name(generation.finish_reason)))
    }
}
