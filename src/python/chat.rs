//! Binding for chat templates: Python messages (dicts, lists, strings, numbers, None) become
//! template values, and the model's `tokenizer.chat_template` (or a given template) renders
//! them with the GIL released.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::errors::IntoPyResult;
use super::PyLoadedModel;
use crate::chat::{map, ChatTemplate, Value};
use crate::error::Error;

/// Deepest nesting accepted in messages (also stops reference cycles).
const MAX_DEPTH: usize = 64;

/// Converts a JSON-like Python object to a template value; `path` names it in errors.
fn to_value(obj: &Bound<'_, PyAny>, path: &str, depth: usize) -> Result<Value, Error> {
    if depth > MAX_DEPTH {
        return Err(Error::invalid_argument(path, format!("nested deeper than {MAX_DEPTH} levels")));
    }
    if obj.is_none() {
        return Ok(Value::from(()));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::from(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj
            .extract::<i64>()
            .map(Value::from)
            .map_err(|_| Error::invalid_argument(path, "integer does not fit in 64 bits"));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::from(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_cow().map_err(|_| Error::invalid_argument(path, "string is not valid Unicode"))?;
        return Ok(Value::from(s.as_ref()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut pairs = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = k
                .cast::<PyString>()
                .ok()
                .and_then(|k| k.to_cow().ok().map(|k| k.into_owned()))
                .ok_or_else(|| Error::invalid_argument(path, "dictionary keys must be strings"))?;
            let value = to_value(&v, &format!("{path}[{key:?}]"), depth + 1)?;
            pairs.push((key, value));
        }
        return Ok(map(pairs));
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        let type_name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(Error::invalid_argument(
            path,
            format!("unsupported type {type_name} (use dict, list, str, int, float, bool or None)"),
        ));
    };
    let values = items
        .iter()
        .enumerate()
        .map(|(i, item)| to_value(item, &format!("{path}[{i}]"), depth + 1))
        .collect::<Result<Vec<Value>, Error>>()?;
    Ok(Value::from(values))
}

/// Renders `messages` with the model's chat template (or `template`), see
/// `reprolm.Model.apply_chat_template`.
#[pyfunction]
#[pyo3(signature = (loaded, messages, *, add_generation_prompt=true, template=None, variables=None))]
fn apply_chat_template(
    py: Python<'_>,
    loaded: &PyLoadedModel,
    messages: &Bound<'_, PyAny>,
    add_generation_prompt: bool,
    template: Option<String>,
    variables: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    if !(messages.is_instance_of::<PyList>() || messages.is_instance_of::<PyTuple>()) {
        return Err(Error::invalid_argument("messages", "must be a list of {'role': ..., 'content': ...} dicts")).py();
    }
    let messages_value = to_value(messages, "messages", 0).py()?;
    for (i, m) in messages.try_iter()?.enumerate() {
        let m = m?;
        let Ok(message) = m.cast::<PyDict>() else {
            return Err(Error::invalid_argument(format!("messages[{i}]"), "must be a dict with 'role' and 'content'")).py();
        };
        // Templates index both keys; a missing one would surface as an opaque render error.
        // An assistant message that calls tools may give 'tool_calls' instead of 'content'.
        for key in ["role", "content"] {
            let given = message.contains(key)? || (key == "content" && message.contains("tool_calls")?);
            if !given {
                return Err(Error::invalid_argument(format!("messages[{i}]"), format!("has no '{key}'"))).py();
            }
        }
    }
    let mut extra = Vec::new();
    if let Some(vars) = variables {
        for (k, v) in vars.iter() {
            let key: String = k
                .extract()
                .map_err(|_| Error::invalid_argument("variables", "names must be strings"))
                .py()?;
            let value = to_value(&v, &key, 0).py()?;
            extra.push((key, value));
        }
    }
    let chat = ChatTemplate::for_loaded(&loaded.loaded, template.as_deref()).py()?;
    py.detach(|| chat.render_value(messages_value, add_generation_prompt, extra)).py()
}

/// The model's own chat template, or None if the file has none.
#[pyfunction]
fn chat_template(loaded: &PyLoadedModel) -> Option<String> {
    ChatTemplate::for_loaded(&loaded.loaded, None).ok().map(|t| t.source().to_owned())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(apply_chat_template, m)?)?;
    m.add_function(wrap_pyfunction!(chat_template, m)?)?;
    Ok(())
}
