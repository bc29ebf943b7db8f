"""Type stubs for the Rust extension module ``reprolm._core``."""

from os import PathLike
from pathlib import Path
from typing import Any, Callable, Literal, Optional, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "LoadedModel",
    "Tokenizer",
    "ModelConfig",
    "Session",
    "SamplerConfig",
    "Stream",
    "Request",
    "submit",
    "softmax",
    "entropy",
    "top_k_set",
    "top_p_set",
    "restrict",
    "total_variation",
    "uniform",
    "apply_chat_template",
    "chat_template",
    "score",
    "gguf_info",
    "dequantize",
    "quantize",
    "convert",
    "quantize_row",
    "CallableModel",
    "engine_beam_search",
    "GrammarSpec",
    "GrammarMatcher",
    "Speculative",
    "solo_session",
    "GenerationParams",
    "__version__",
]

__version__: str

@final
class Tokenizer:
    def __new__(cls, path: PathLike[str]) -> Tokenizer: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    @property
    def eos_id(self) -> Optional[int]: ...
    def encode(self, text: str, *, special: bool = False, add_special: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_bytes(self, id: int) -> bytes: ...
    def is_special(self, id: int) -> bool: ...

@final
class ModelConfig:
    @property
    def architecture(self) -> str: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def ffn_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def rope_base(self) -> float: ...
    @property
    def rms_eps(self) -> float: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    @property
    def eos_id(self) -> Optional[int]: ...

@final
class SamplerConfig:
    def __new__(
        cls,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        repetition_penalty: float,
        penalty_window: Optional[int],
        presence_penalty: float,
        frequency_penalty: float,
        logit_bias: list[tuple[int, float]],
        allowed_token_ids: Optional[list[int]],
        banned_token_ids: list[int],
        seed: int,
        top_logprobs: int,
        logprobs_mode: str = "processed",
    ) -> SamplerConfig: ...
    def distribution(
        self, logits: npt.NDArray[np.float32], history: list[int], n_prompt: int
    ) -> npt.NDArray[np.float64]: ...
    def sample(
        self, logits: npt.NDArray[np.float32], history: list[int], n_prompt: int, step: int
    ) -> _StepTuple: ...

# (token id, ln q(token), entropy of q, removed mass, [(id, ln q(id))] alternatives)
_StepTuple = tuple[int, float, float, float, list[tuple[int, float]]]
# (text delta, ids, finish reason on the last chunk, ln q per id, step statistics if asked for)
_ChunkTuple = tuple[str, list[int], Optional[Literal["eos", "length", "stop"]], list[float], Optional[_StepTuple]]
# (drafted, accepted, passes, drafting passes)
_SpeculationTuple = tuple[int, int, int, int]
# (ids, finish reason, per-step statistics or [], speculation statistics or None)
_GenerationTuple = tuple[list[int], Literal["eos", "length", "stop"], list[_StepTuple], Optional[_SpeculationTuple]]
# (ids, log-probability, score, finished)
_BeamTuple = tuple[list[int], float, float, bool]

@final
class CallableModel:
    def __new__(
        cls, function: Callable[[list[int]], npt.ArrayLike], vocab_size: int, eos_id: Optional[int] = None
    ) -> CallableModel: ...
    @property
    def function(self) -> Callable[[list[int]], npt.ArrayLike]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_id(self) -> Optional[int]: ...
    def generate(self, prompt_ids: list[int], params: GenerationParams) -> _GenerationTuple: ...
    def beam_search(
        self, prompt_ids: list[int], *, beam_width: int, max_tokens: int, length_penalty: float
    ) -> list[_BeamTuple]: ...

def engine_beam_search(
    loaded: LoadedModel, ids: list[int], *, beam_width: int, max_tokens: int, length_penalty: float
) -> list[_BeamTuple]: ...

@final
class LoadedModel:
    def __new__(
        cls,
        path: PathLike[str],
        *,
        threads: Optional[int] = None,
        isa: Optional[str] = None,
        precision: Optional[str] = None,
        max_concurrent: Optional[int] = None,
        max_queue: Optional[int] = None,
        max_batch_tokens: Optional[int] = None,
        kv_memory: Optional[int] = None,
        kv_dtype: Optional[str] = None,
        prefix_cache_bytes: Optional[int] = None,
    ) -> LoadedModel: ...
    def wait_ready(self, timeout: float) -> list[int]: ...
    def engine_stats(self) -> tuple[tuple[int, int, int, int, int, int, int, int, int, int], tuple[int, int, int]]: ...
    @property
    def prefix_cache_bytes(self) -> int: ...
    @property
    def kv_bytes_per_position(self) -> int: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def threads(self) -> int: ...
    @property
    def isa(self) -> str: ...
    @property
    def fingerprint(self) -> int: ...
    @property
    def weight_bytes_per_token(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def path(self) -> Path: ...
    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...
    def detokenize(self, ids: list[int]) -> str: ...
    def token_bytes(self, id: int) -> bytes: ...
    def logits(self, ids: list[int]) -> npt.NDArray[np.float32]: ...

@final
class Session:
    def __new__(
        cls,
        loaded: LoadedModel,
        *,
        context_length: Optional[int] = None,
        kv_dtype: str = "f32",
        overflow: str = "error",
        n_keep: int = 4,
    ) -> Session: ...
    @staticmethod
    def load(loaded: LoadedModel, path: PathLike[str]) -> Session: ...
    def save(self, path: PathLike[str]) -> None: ...
    @property
    def tokens(self) -> list[int]: ...
    @property
    def context_length(self) -> int: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def overflow(self) -> str: ...
    @property
    def n_keep(self) -> int: ...
    @property
    def kv_bytes(self) -> int: ...
    def feed(self, ids: list[int]) -> npt.NDArray[np.float32]: ...
    def truncate(self, n: int) -> None: ...
    def generate(
        self, ids: list[int], params: GenerationParams
    ) -> tuple[
        list[int], str, Literal["eos", "length", "stop"], list[float], list[_StepTuple], Optional[_SpeculationTuple]
    ]: ...
    def stream(self, ids: list[int], params: GenerationParams) -> Stream: ...

@final
class Stream:
    def __iter__(self) -> Stream: ...
    def __next__(self) -> _ChunkTuple: ...
    @property
    def speculation(self) -> Optional[_SpeculationTuple]: ...
    def close(self) -> None: ...

@final
class Speculative:
    def __new__(
        cls, drafter: object, *, draft_tokens: int, adaptive: bool, ngram_min: int, ngram_max: int
    ) -> Speculative: ...
    @property
    def draft_tokens(self) -> int: ...
    @property
    def adaptive(self) -> bool: ...

def solo_session(loaded: LoadedModel, prompt_len: int, params: GenerationParams) -> Session: ...

@final
class Request:
    @property
    def id(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    def next(self) -> Optional[_ChunkTuple]: ...
    def try_next(self) -> tuple[bool, Optional[_ChunkTuple]]: ...
    def watch(self) -> None: ...
    def cancel(self) -> None: ...

def submit(loaded: LoadedModel, ids: list[int], params: GenerationParams) -> Request: ...

@final
class GenerationParams:
    def __new__(
        cls,
        *,
        max_tokens: int,
        sampler: SamplerConfig,
        stop: list[str],
        stop_token_ids: list[int],
        logprobs: Optional[int] = None,
        logprobs_mode: Optional[str] = None,
        grammar: Optional[GrammarSpec] = None,
        speculative: Optional[Speculative] = None,
    ) -> GenerationParams: ...

@final
class GrammarSpec:
    @staticmethod
    def json_schema(schema: str) -> GrammarSpec: ...
    @staticmethod
    def regex(pattern: str) -> GrammarSpec: ...
    @staticmethod
    def lark(grammar: str) -> GrammarSpec: ...
    @staticmethod
    def choice(options: list[str]) -> GrammarSpec: ...

@final
class GrammarMatcher:
    def __new__(cls, loaded: LoadedModel, spec: GrammarSpec) -> GrammarMatcher: ...
    def allowed_token_ids(self) -> list[int]: ...
    def allowed_count(self) -> int: ...
    def accept(self, token_id: int) -> None: ...
    def is_accepting(self) -> bool: ...
def apply_chat_template(
    loaded: LoadedModel,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    template: Optional[str] = None,
    variables: Optional[dict[str, Any]] = None,
) -> str: ...
def chat_template(loaded: LoadedModel) -> Optional[str]: ...

# (id, ln p(id | ids before it), is_greedy, [(id, ln p)] of the most probable there)
_ScoredTuple = tuple[int, float, bool, list[tuple[int, float]]]

def score(loaded: LoadedModel, ids: list[int], *, start: int, top: int) -> list[_ScoredTuple]: ...
def gguf_info(
    path: PathLike[str],
) -> tuple[int, list[tuple[str, str]], list[tuple[str, str, list[int], int]]]: ...
def dequantize(type_id: int, data: bytes) -> npt.NDArray[np.float32]: ...
def quantize(
    src: PathLike[str],
    dst: PathLike[str],
    *,
    weight_type: str,
    scheme: str,
    clip: Optional[float],
    output_type: Optional[str],
    report_text: Optional[str],
) -> tuple[
    list[
        tuple[
            str,
            str,
            list[int],
            tuple[int, int, int, int],
            tuple[float, float, float, float, float, float, float],
        ]
    ],
    Optional[tuple[float, float, int]],
]: ...
def convert(src: PathLike[str], dst: PathLike[str], *, to: str) -> None: ...
def quantize_row(
    values: npt.NDArray[np.float32], *, weight_type: str, scheme: str, clip: Optional[float]
) -> bytes: ...
def softmax(z: npt.NDArray[np.float64], temperature: float) -> npt.NDArray[np.float64]: ...
def entropy(p: npt.NDArray[np.float64]) -> float: ...
def top_k_set(p: npt.NDArray[np.float64], k: int) -> list[int]: ...
def top_p_set(p: npt.NDArray[np.float64], top_p: float) -> list[int]: ...
def restrict(p: npt.NDArray[np.float64], subset: list[int]) -> npt.NDArray[np.float64]: ...
def total_variation(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64]) -> float: ...
def uniform(seed: int, step: int) -> float: ...
