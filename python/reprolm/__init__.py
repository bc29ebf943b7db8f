"""reprolm: bitwise-reproducible CPU inference for Llama-family GGUF models.

>>> import reprolm
>>> model = reprolm.Model.default()          # SmolLM2-135M-Instruct, fetched on first use
>>> model.generate("The capital of France is", max_tokens=8).text
' Paris.\\n\\nThe answer is: '
"""

from __future__ import annotations

from . import sampling
from ._callable import CallableModel
from ._core import ModelConfig, __version__
from ._decoding import Beam, StepInfo
from ._score import Score
from ._download import cache_dir, default_model_path, known_models, model_path, model_terms
from ._gguf import GgufInfo, TensorEntry, dequantize, inspect
from .grammar import Grammar, GrammarMatcher
from ._params import GenerationParams
from ._model import Chunk, Completion, EngineStats, FinishReason, Message, Model, Prompt, Request, Session
from ._quantize import QuantizeReport, TensorReport, convert, quantize, quantize_row
from .errors import (
    ChatTemplateError,
    ContextOverflowError,
    EmptyPromptError,
    GgufFormatError,
    GrammarError,
    ToolError,
    InvalidArgumentError,
    InvalidInputError,
    InvalidModelError,
    InvalidTypeError,
    ModelDownloadError,
    RequestCancelledError,
    EngineStoppedError,
    EngineOverloadedError,
    InternalError,
    ReprolmError,
    SessionStateError,
    StateFormatError,
    StateModelMismatchError,
    StateVersionError,
    TokenizerError,
    TokenOutOfRangeError,
    UnknownTensorTypeError,
    UnsupportedError,
)
from ._tokenizer import Tokenizer
from .sampling import Sampler
from ._results import SpeculationStats
from .speculative import Speculative

__all__ = [
    "Model",
    "Session",
    "Request",
    "EngineStats",
    "Completion",
    "Chunk",
    "Message",
    "StepInfo",
    "Score",
    "Beam",
    "CallableModel",
    "FinishReason",
    "Prompt",
    "ModelConfig",
    "Sampler",
    "GenerationParams",
    "Tokenizer",
    "sampling",
    "Grammar",
    "GrammarMatcher",
    "Speculative",
    "SpeculationStats",
    "default_model_path",
    "known_models",
    "model_path",
    "model_terms",
    "cache_dir",
    "inspect",
    "GgufInfo",
    "TensorEntry",
    "dequantize",
    "quantize",
    "convert",
    "quantize_row",
    "QuantizeReport",
    "TensorReport",
    "ReprolmError",
    "GgufFormatError",
    "UnsupportedError",
    "UnknownTensorTypeError",
    "InvalidModelError",
    "TokenizerError",
    "InvalidInputError",
    "TokenOutOfRangeError",
    "EmptyPromptError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "ContextOverflowError",
    "SessionStateError",
    "StateFormatError",
    "StateVersionError",
    "StateModelMismatchError",
    "ChatTemplateError",
    "GrammarError",
    "ToolError",
    "ModelDownloadError",
    "RequestCancelledError",
    "EngineStoppedError",
    "EngineOverloadedError",
    "InternalError",
    "__version__",
]
