//! Bindings for constrained decoding: a checked grammar spec, and one sequence's position in a
//! grammar compiled for a model (see `reprolm.Grammar`).

use std::sync::Mutex;

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::PyLoadedModel;
use crate::loaded_model::LoadedModel;
use crate::error::Error;
use crate::grammar::{Grammar, GrammarSpec, GrammarState};

/// What the generated text must be, checked for errors when made.
#[pyclass(frozen, name = "GrammarSpec", module = "reprolm._core")]
pub struct PyGrammarSpec {
    pub spec: GrammarSpec,
}

impl PyGrammarSpec {
    fn checked(py: Python<'_>, spec: GrammarSpec) -> PyResult<Self> {
        py.detach(|| Grammar::check(&spec)).py()?;
        Ok(PyGrammarSpec { spec })
    }
}

#[pymethods]
impl PyGrammarSpec {
    /// A JSON Schema given as JSON text.
    #[staticmethod]
    fn json_schema(py: Python<'_>, schema: String) -> PyResult<Self> {
        Self::checked(py, GrammarSpec::JsonSchema(schema))
    }

    #[staticmethod]
    fn regex(py: Python<'_>, pattern: String) -> PyResult<Self> {
        Self::checked(py, GrammarSpec::Regex(pattern))
    }

    #[staticmethod]
    fn lark(py: Python<'_>, grammar: String) -> PyResult<Self> {
        Self::checked(py, GrammarSpec::Lark(grammar))
    }

    #[staticmethod]
    fn choice(py: Python<'_>, options: Vec<String>) -> PyResult<Self> {
        Self::checked(py, GrammarSpec::Choice(options))
    }
}

/// `spec` compiled for `engine`'s vocabulary (GIL released).
pub(super) fn compile(py: Python<'_>, loaded: &LoadedModel, spec: &PyGrammarSpec) -> PyResult<Grammar> {
    py.detach(|| loaded.compile_grammar(&spec.spec)).py()
}

/// One sequence's position in a grammar compiled for a model: the allowed set of the next
/// token, and the tokens accepted so far.
#[pyclass(frozen, name = "GrammarMatcher", module = "reprolm._core")]
pub struct PyGrammarMatcher {
    state: Mutex<GrammarState>,
}

impl PyGrammarMatcher {
    fn with<R>(&self, f: impl FnOnce(&mut GrammarState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[pymethods]
impl PyGrammarMatcher {
    #[new]
    fn new(py: Python<'_>, loaded: &PyLoadedModel, spec: &PyGrammarSpec) -> PyResult<Self> {
        Ok(PyGrammarMatcher { state: Mutex::new(compile(py, &loaded.loaded, spec)?.start()) })
    }

    /// The ids the grammar allows as the next token, ascending.
    fn allowed_token_ids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        py.detach(|| self.with(GrammarState::allowed_ids)).py()
    }

    /// How many ids the grammar allows as the next token (computes S without listing it).
    fn allowed_count(&self, py: Python<'_>) -> PyResult<usize> {
        let count = |s: &mut GrammarState| s.allowed().map(|bits| bits.iter().map(|w| w.count_ones() as usize).sum());
        py.detach(|| self.with(count)).py()
    }

    /// Advances past `token_id`, which must be allowed.
    fn accept(&self, py: Python<'_>, token_id: i64) -> PyResult<()> {
        let token = u32::try_from(token_id)
            .map_err(|_| Error::invalid_argument("token_id", format!("{token_id} is not a token id")))
            .py()?;
        py.detach(|| self.with(|s| s.accept(token))).py()
    }

    /// Whether the text so far is complete (the end-of-sequence token is allowed).
    fn is_accepting(&self) -> bool {
        self.with(GrammarState::is_accepting)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGrammarSpec>()?;
    m.add_class::<PyGrammarMatcher>()?;
    Ok(())
}
