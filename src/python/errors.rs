//! The one place where [`Error`] becomes a Python exception. The classes live in
//! `reprolm/errors.py` so they can inherit from both `ReprolmError` and a builtin
//! (`ValueError`, `OSError`, ...).

use pyo3::exceptions::{PyFileNotFoundError, PyIsADirectoryError, PyKeyboardInterrupt, PyOSError, PyPermissionError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

use crate::error::Error;

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `reprolm.errors` class for each variant.
fn class_name(e: &Error) -> &'static str {
    match e {
        Error::FileNotFound(_) | Error::Io { .. } | Error::Write { .. } | Error::Interrupted => unreachable!("builtin exception"),
        Error::Format(_) => "GgufFormatError",
        Error::Unsupported(_) => "UnsupportedError",
        Error::UnknownTensorType { .. } => "UnknownTensorTypeError",
        Error::Model(_) => "InvalidModelError",
        Error::Tokenizer(_) => "TokenizerError",
        Error::TokenOutOfRange { .. } => "TokenOutOfRangeError",
        Error::EmptyPrompt => "EmptyPromptError",
        Error::InvalidArgument { .. } => "InvalidArgumentError",
        Error::ContextOverflow { .. } => "ContextOverflowError",
        Error::StateFormat(_) => "StateFormatError",
        Error::StateVersion { .. } => "StateVersionError",
        Error::StateModelMismatch(_) => "StateModelMismatchError",
        Error::ChatTemplate(_) => "ChatTemplateError",
        Error::Grammar(_) => "GrammarError",
        Error::Cancelled => "RequestCancelledError",
        Error::QueueFull { .. } => "EngineOverloadedError",
        Error::EngineStopped(_) => "EngineStoppedError",
        Error::Internal(_) => "InternalError",
    }
}

pub fn to_pyerr(e: Error) -> PyErr {
    let message = e.to_string();
    match &e {
        Error::FileNotFound(_) => return PyFileNotFoundError::new_err(message),
        Error::Interrupted => return PyKeyboardInterrupt::new_err(message),
        Error::Io { source, .. } | Error::Write { source, .. } => {
            return match source.kind() {
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                    PyPermissionError::new_err(message)
                }
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::IsADirectory => {
                    PyIsADirectoryError::new_err(message)
                }
                std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
                _ => PyOSError::new_err(message),
            }
        }
        _ => {}
    }
    Python::attach(|py| {
        let module = match ERRORS_MODULE.get_or_try_init(py, || PyModule::import(py, "reprolm.errors").map(Bound::unbind)) {
            Ok(m) => m.bind(py),
            Err(err) => return err,
        };
        match module.getattr(class_name(&e)) {
            Ok(class) => PyErr::from_type(class.cast_into().expect("an exception class"), message),
            Err(err) => err,
        }
    })
}

/// `?`-friendly conversion for binding code.
pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}
