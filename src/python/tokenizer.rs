//! Bindings for a GGUF file's tokenizer on its own (`reprolm.Tokenizer`): no weights loaded,
//! so it works on vocabulary-only files too.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::IntoPyResult;
use crate::error::Error;
use crate::gguf::GgufFile;
use crate::tokenizer::{Tokenizer, TokenizerSpec};

#[pyclass(frozen, name = "Tokenizer", module = "reprolm._core")]
pub(crate) struct PyTokenizer {
    tokenizer: Tokenizer,
}

impl PyTokenizer {
    fn id(&self, id: i64) -> PyResult<u32> {
        let vocab_size = self.tokenizer.vocab_size();
        u32::try_from(id)
            .ok()
            .filter(|&v| (v as usize) < vocab_size)
            .ok_or(Error::TokenOutOfRange { id, vocab_size })
            .py()
    }
}

#[pymethods]
impl PyTokenizer {
    /// Reads the `tokenizer.ggml.*` metadata of a GGUF file (tensor data is not read).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let tokenizer = py
            .detach(|| GgufFile::open(&path).and_then(|file| Tokenizer::from_spec(TokenizerSpec::from_gguf(&file)?)))
            .py()?;
        Ok(PyTokenizer { tokenizer })
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    #[getter]
    fn kind(&self) -> String {
        self.tokenizer.kind()
    }

    #[getter]
    fn bos_id(&self) -> Option<u32> {
        self.tokenizer.bos_id()
    }

    #[getter]
    fn eos_id(&self) -> Option<u32> {
        self.tokenizer.eos_id()
    }

    #[pyo3(signature = (text, *, special=false, add_special=true))]
    fn encode(&self, py: Python<'_>, text: &str, special: bool, add_special: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.tokenizer.encode_with(text, special, add_special)).py()
    }

    fn decode(&self, py: Python<'_>, ids: Vec<i64>) -> PyResult<String> {
        let ids = ids.into_iter().map(|id| self.id(id)).collect::<PyResult<Vec<u32>>>()?;
        py.detach(|| self.tokenizer.decode(&ids)).py()
    }

    fn token_bytes<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyBytes>> {
        let id = self.id(id)?;
        Ok(PyBytes::new(py, self.tokenizer.token_bytes(id).py()?))
    }

    fn is_special(&self, id: i64) -> bool {
        u32::try_from(id).is_ok_and(|id| self.tokenizer.is_special(id))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTokenizer>()
}
