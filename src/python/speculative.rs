//! The `Speculative` binding: which drafter speculative decoding uses and how many tokens it
//! drafts (see `reprolm.Speculative`), built into a [`Speculation`] for each generation.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::callable::PyCallableModel;
use super::errors::IntoPyResult;
use super::PyLoadedModel;
use crate::decode::speculative::{DraftLength, DraftModel, Drafter, PromptLookup, Speculation, SpeculationStats};
use crate::decode::GenerationSpec;
use crate::loaded_model::{LoadedModel, Session};
use crate::error::{Error, Result};

/// The drafter a `Speculative` names.
enum DrafterSpec {
    Lookup(PromptLookup),
    Model(Arc<LoadedModel>),
    Callable(Py<PyCallableModel>),
}

/// Speculative decoding settings: the drafter ("lookup", a model's engine, or a
/// `CallableModel`), the most tokens drafted per pass, and whether that number adapts.
#[pyclass(frozen, name = "Speculative", module = "reprolm._core")]
pub struct PySpeculative {
    drafter: DrafterSpec,
    length: DraftLength,
}

/// The statistics as Python sees them: (drafted, accepted, passes, drafting passes).
pub(super) type StatsTuple = (u64, u64, u64, u64);

pub(super) fn stats_tuple(s: SpeculationStats) -> StatsTuple {
    (s.drafted, s.accepted, s.passes, s.drafting_passes)
}

fn count(name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_argument(name, format!("must be >= 0, got {v}")))
}

impl PySpeculative {
    /// The speculation for `request` on a loaded target model.
    pub(super) fn for_loaded(&self, target: &LoadedModel, request: &GenerationSpec) -> Result<Speculation<'static>> {
        let drafter: Box<dyn Drafter> = match &self.drafter {
            DrafterSpec::Lookup(lookup) => Box::new(lookup.clone()),
            DrafterSpec::Model(draft) => {
                // The drafter computes the context and its drafts but the last.
                let needed = request.positions_needed() + 1;
                let allowed = draft.config().context_length;
                if needed > allowed {
                    return Err(Error::ContextOverflow { requested: needed, allowed });
                }
                let session = Session::new(Arc::clone(draft), needed)?;
                Box::new(DraftModel::new(session, &request.sampler, target.config().eos_id)?)
            }
            DrafterSpec::Callable(_) => {
                return Err(Error::invalid_argument("speculative", "a CallableModel drafts only for a CallableModel"))
            }
        };
        Ok(Speculation::new(drafter, self.length))
    }

    /// The speculation for `request` on a callable target, whose drafter (if a callable too)
    /// is `draft` (see [`PySpeculative::callable_drafter`]).
    pub(super) fn for_callable<'a>(
        &self,
        request: &GenerationSpec,
        eos: Option<u32>,
        draft: Option<Box<dyn Drafter + 'a>>,
    ) -> Result<Speculation<'a>> {
        let drafter: Box<dyn Drafter + 'a> = match (&self.drafter, draft) {
            (_, Some(drafter)) => drafter,
            (DrafterSpec::Lookup(lookup), None) => Box::new(lookup.clone()),
            (DrafterSpec::Model(draft), None) => {
                let session = Session::new(Arc::clone(draft), request.positions_needed() + 1)?;
                Box::new(DraftModel::new(session, &request.sampler, eos)?)
            }
            (DrafterSpec::Callable(_), None) => {
                return Err(Error::invalid_argument("speculative", "a CallableModel drafter needs its callback"))
            }
        };
        Ok(Speculation::new(drafter, self.length))
    }

    /// The drafter's `CallableModel`, if it is one.
    pub(super) fn callable_drafter<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, PyCallableModel>> {
        match &self.drafter {
            DrafterSpec::Callable(model) => Some(model.bind(py)),
            _ => None,
        }
    }
}

#[pymethods]
impl PySpeculative {
    #[new]
    #[pyo3(signature = (drafter, *, draft_tokens, adaptive, ngram_min, ngram_max))]
    fn new(drafter: &Bound<'_, PyAny>, draft_tokens: i64, adaptive: bool, ngram_min: i64, ngram_max: i64) -> PyResult<Self> {
        let drafter = if let Ok(name) = drafter.extract::<String>() {
            if name != "lookup" {
                return Err(Error::invalid_argument("speculative", format!("the drafter must be \"lookup\" or a model, got {name:?}")))
                    .py();
            }
            DrafterSpec::Lookup(PromptLookup::new(count("ngram_min", ngram_min).py()?, count("ngram_max", ngram_max).py()?).py()?)
        } else if let Ok(loaded) = drafter.cast::<PyLoadedModel>() {
            DrafterSpec::Model(Arc::clone(&loaded.get().loaded))
        } else if let Ok(model) = drafter.cast::<PyCallableModel>() {
            DrafterSpec::Callable(model.clone().unbind())
        } else {
            return Err(PyTypeError::new_err(format!(
                "the drafter must be \"lookup\", a Model or a CallableModel, got {}",
                drafter.get_type().name()?
            )));
        };
        let length = DraftLength::new(count("draft_tokens", draft_tokens).py()?, adaptive).py()?;
        Ok(PySpeculative { drafter, length })
    }

    #[getter]
    fn draft_tokens(&self) -> usize {
        self.length.max
    }

    #[getter]
    fn adaptive(&self) -> bool {
        self.length.adaptive
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpeculative>()?;
    Ok(())
}
