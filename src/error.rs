//! The crate's one error type. Every fallible operation returns [`Result`]; the Python layer
//! maps each variant to one exception class in `src/python/errors.rs` (and nowhere else).

use std::path::PathBuf;

/// Everything that can go wrong in reprolm, with the file, tensor, key or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path does not exist.
    #[error("no such file: {0}")]
    FileNotFound(PathBuf),

    /// Any other I/O failure (permission, directory instead of file, ...).
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Writing an output file failed (permission, missing directory, disk full, ...).
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not a well-formed GGUF file (bad magic, truncated, absurd counts, ...).
    #[error("invalid GGUF file: {0}")]
    Format(String),

    /// A well-formed GGUF using something reprolm does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A tensor whose ggml type id reprolm does not know or cannot compute with.
    #[error(
        "tensor '{tensor}' has type {}, which reprolm does not support (it supports {})",
        crate::tensor::describe_type_id(*type_id),
        crate::tensor::supported_type_names()
    )]
    UnknownTensorType { tensor: String, type_id: u32 },

    /// Metadata required to build the model or tokenizer is missing or inconsistent.
    #[error("invalid model: {0}")]
    Model(String),

    /// Tokenizer construction or encoding/decoding failure.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    /// A token id outside `0..vocab_size`.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange { id: i64, vocab_size: usize },

    /// An empty prompt where at least one token is required.
    #[error("the prompt is empty: at least one token is required")]
    EmptyPrompt,

    /// A setting outside its allowed range; `name` is the setting as the user spells it.
    #[error("invalid value for '{name}': {message}")]
    InvalidArgument { name: String, message: String },

    /// The sequence would outgrow the KV cache.
    #[error("context overflow: {requested} tokens requested, at most {allowed} fit")]
    ContextOverflow { requested: usize, allowed: usize },

    /// A session state file that is not one, or is damaged (truncated, altered, inconsistent).
    #[error("invalid session state file: {0}")]
    StateFormat(String),

    /// A session state file written by another version of the format.
    #[error("session state file has format version {found}; this reprolm reads version {supported}")]
    StateVersion { found: u32, supported: u32 },

    /// A session state file saved with another model (or another model file).
    #[error("session state file belongs to another model: {0}")]
    StateModelMismatch(String),
    /// A chat template is missing, malformed, or failed to render (its own `raise_exception`
    /// included).
    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// A grammar for constrained decoding that cannot be used: invalid JSON Schema, an
    /// unsupported keyword, a regular expression or Lark syntax error, a grammar no token of
    /// the vocabulary can start; or one that failed while generating (the message says which).
    #[error("grammar: {0}")]
    Grammar(String),

    /// Generation was interrupted by the caller (e.g. Ctrl-C).
    #[error("interrupted")]
    Interrupted,

    /// The request was cancelled before it finished.
    #[error("the request was cancelled")]
    Cancelled,

    /// The batch engine's queue of waiting requests is full.
    #[error("the engine is overloaded: {waiting} requests are already waiting (max_queue)")]
    QueueFull { waiting: usize },

    /// The batch engine stopped (its model was closed, or an internal failure).
    #[error("the batch engine stopped: {0}")]
    EngineStopped(String),

    /// A failure inside reprolm itself (a bug): a panic caught in a computation, or worker
    /// threads that could not be started. The model stays usable.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid_argument(name: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument { name: name.into(), message: message.into() }
    }
}
