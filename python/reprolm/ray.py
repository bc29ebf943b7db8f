"""Batch generation over a Ray cluster with Ray Data (``pip install 'reprolm[ray]'``).

:class:`Predictor` is a callable class for ``Dataset.map_batches``: each Ray actor loads the
model once and generates a completion for every row of each batch it is given, submitting
all of them to the model's batch engine at once. :func:`generate` wraps that call.

A row's output depends only on the row (its prompt, settings and seed) and the model file:
never on how the rows were split into batches, how many actors or machines ran them, or
their thread counts. Seeds are per row (see :func:`row_seed`), never drawn from a shared
state or a position in the dataset.

Output columns (named with ``output_prefix`` in front): ``text`` (string), ``token_ids``
(list of int64), ``finish_reason`` (string: ``"eos"``, ``"stop"`` or ``"length"``),
``logprobs`` (list of float64, only with ``logprobs=True``) and ``error`` (string). A row
whose input is bad (an empty or missing prompt, a sampler setting out of range, a bad seed,
a prompt too long for the context) gets ``"ExceptionName: message"`` in ``error`` and nulls
in the other output columns; the other rows of its batch complete. ``error`` is null for
every row that completed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

# Absolute imports: these are the top-level ``ray`` and ``pyarrow`` packages, not this module.
try:
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
    import ray
    import ray.data
except ImportError:  # pragma: no cover - depends on the environment (the cause stays chained)
    raise ImportError("reprolm.ray needs Ray Data: pip install 'reprolm[ray]'")

from ._download import fetch_default_model
from ._model import KvDtype, Model, Precision
from ._params import GenerationParams
from ._request import Request
from ._results import Completion
from .errors import ContextOverflowError, InvalidArgumentError, InvalidInputError, InvalidTypeError
from .sampling import Sampler

__all__ = ["Predictor", "generate", "row_seed", "OUTPUT_COLUMNS"]

OUTPUT_COLUMNS = ("text", "token_ids", "finish_reason", "logprobs", "error")
"""The output columns (``logprobs`` only with ``logprobs=True``), before ``output_prefix``."""

_SAMPLER_FIELDS = frozenset(f.name for f in dataclasses.fields(Sampler))
# Errors that a row's own input causes: reported in its error column, the batch goes on.
# Anything else (the engine stopped, out of memory, a bug) fails the batch, and Ray retries it.
_ROW_ERRORS = (InvalidInputError, ContextOverflowError)

ModelSpec = Union[str, "os.PathLike[str]", None]
"""``"default"`` (or None): the default model, fetched and verified on each node; otherwise
the path of a GGUF file that exists on every node."""


def row_seed(base_seed: int, key: Union[int, str]) -> int:
    """The seed of the row with stable key ``key`` under ``base_seed``: the first 8 bytes,
    read as a little-endian unsigned integer, of the SHA-256 of the UTF-8 text
    ``f"{base_seed}:{key}"`` (an int key as its decimal text, so ``7`` and ``"7"`` are the
    same key). Any process on any machine computes the same seed, in 0..2^64."""
    if isinstance(base_seed, bool) or not isinstance(base_seed, int):
        raise InvalidTypeError(f"base_seed must be an int, got {type(base_seed).__name__}")
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise InvalidTypeError(f"a row key must be an int or a str, got {type(key).__name__}")
    digest = hashlib.sha256(f"{int(base_seed)}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little")


def _sampler_fields(sampler: Union[Sampler, Mapping[str, Any], None]) -> dict[str, Any]:
    """A sampler as plain settings (what crosses to the actors: the settings, not the engine
    object). Unknown names raise InvalidArgumentError."""
    if sampler is None:
        return {"temperature": 0.0}
    if isinstance(sampler, Sampler):
        return {f.name: getattr(sampler, f.name) for f in dataclasses.fields(Sampler)}
    if not isinstance(sampler, Mapping):
        raise InvalidTypeError(f"sampler must be a reprolm.Sampler or a mapping of its settings, "
                               f"got {type(sampler).__name__}")
    unknown = sorted(set(sampler) - _SAMPLER_FIELDS)
    if unknown:
        raise InvalidArgumentError(f"unknown sampler settings {unknown}; Sampler has {sorted(_SAMPLER_FIELDS)}")
    return dict(sampler)


def _make_sampler(fields: Mapping[str, Any], where: str) -> Sampler:
    """Sampler(**fields), any bad value as an InvalidArgumentError (Sampler's own ValueError or
    TypeError from a value that is not a number, say)."""
    fields = dict(fields)
    if "logit_bias" in fields and not isinstance(fields["logit_bias"], Mapping):
        try:  # an Arrow map, or a list of (id, bias) pairs
            fields["logit_bias"] = {int(k): float(v) for k, v in fields["logit_bias"]}
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"{where}: logit_bias must be a mapping or (id, bias) pairs") from error
    try:
        return Sampler(**fields)
    except InvalidInputError:
        raise
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{where}: {error}") from error


def _load_model(model: ModelSpec, **options: Any) -> Model:
    if model is None or (isinstance(model, str) and model == "default"):
        return Model.load(fetch_default_model(), **options)
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(
            f"model file {str(path)!r} not found on node {socket.gethostname()}: a local path must exist on every "
            "node of the cluster (copy it there, or use model='default', which each node fetches and verifies)"
        )
    return Model.load(path, **options)


def _to_table(batch: Any) -> Any:
    """A batch as a pyarrow Table (Ray Data's "pyarrow" format; a pandas DataFrame or a
    mapping of columns, such as the "numpy" format, is converted)."""
    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return pa.Table.from_pandas(batch, preserve_index=False)
    if isinstance(batch, Mapping):
        return pa.table({name: list(values) for name, values in batch.items()})
    raise InvalidTypeError(f"a batch must be a pyarrow Table, a pandas DataFrame or a mapping of columns, "
                           f"got {type(batch).__name__}")


def _prompt(value: Any) -> Any:
    """A prompt cell: text, or token ids (a list from Arrow; a NumPy array from other formats)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        return value.tolist()
    return value


class Predictor:
    """A callable class for ``ray.data.Dataset.map_batches``: each actor loads the model once
    (``model``: ``"default"``/None, fetched and verified on the node, or a path that must exist
    on every node) with ``threads`` threads and generates a completion for each row.

    ``dataset.map_batches(Predictor, fn_constructor_kwargs={...}, batch_format="pyarrow",
    compute=ray.data.ActorPoolStrategy(size=n), num_cpus=threads)`` is what :func:`generate`
    does. Called with a batch (a pyarrow Table, a pandas DataFrame or a mapping of columns),
    it returns the batch as a pyarrow Table with the output columns appended (see the module's
    documentation).

    ``precision``, ``isa`` and ``kv_dtype`` are :meth:`reprolm.Model.load`'s. Settings:
    ``max_tokens``, ``stop``, ``stop_token_ids``, ``special`` as in
    :meth:`reprolm.Model.generate`; ``sampler`` (a :class:`reprolm.Sampler` or a mapping of
    its settings; default greedy) for every row. Per row:

    - ``sampler_column``: a column of mappings of :class:`Sampler` settings (null cells and
      null values keep ``sampler``'s) that replace ``sampler``'s for that row.
    - the row's seed: the ``seed_column``'s int if given; else, with ``key_column`` (a
      column of ints or strings that identify rows stably, such as an id),
      :func:`row_seed(seed, key) <row_seed>` where ``seed`` is the row's sampler seed;
      else the row's sampler seed. (Greedy rows use no seed.)
    """

    def __init__(
        self,
        model: ModelSpec = "default",
        *,
        prompt_column: str = "prompt",
        threads: int = 1,
        precision: Precision = "float32",
        isa: Optional[str] = None,
        kv_dtype: KvDtype = "f32",
        max_tokens: int = 256,
        sampler: Union[Sampler, Mapping[str, Any], None] = None,
        stop: Union[str, Sequence[str]] = (),
        stop_token_ids: Sequence[int] = (),
        special: bool = True,
        logprobs: bool = False,
        sampler_column: Optional[str] = None,
        seed_column: Optional[str] = None,
        key_column: Optional[str] = None,
        output_prefix: str = "",
    ) -> None:
        if seed_column is not None and key_column is not None:
            raise InvalidArgumentError("give seed_column or key_column, not both")
        self._sampler_fields = _sampler_fields(sampler)
        self._params = GenerationParams(max_tokens=max_tokens, sampler=_make_sampler(self._sampler_fields, "sampler"),
                                        stop=stop, stop_token_ids=stop_token_ids)
        self._prompt_column = prompt_column
        self._special = special
        self._logprobs = logprobs
        self._sampler_column = sampler_column
        self._seed_column = seed_column
        self._key_column = key_column
        self._names = {c: output_prefix + c for c in OUTPUT_COLUMNS if logprobs or c != "logprobs"}
        self._model = _load_model(model, threads=threads, precision=precision, isa=isa, kv_dtype=kv_dtype)

    @property
    def model(self) -> Model:
        return self._model

    def _column(self, table: Any, name: Optional[str]) -> list[Any]:
        if name is None:
            return [None] * table.num_rows
        if name not in table.column_names:
            raise KeyError(f"no column {name!r} in the batch (columns: {table.column_names})")
        return list(table.column(name).to_pylist())

    def _row_sampler(self, settings: Any, seed: Any, key: Any) -> Sampler:
        sampler = self._params.sampler
        assert sampler is not None, "the params are built with a sampler"
        if settings is not None:
            if not isinstance(settings, Mapping):
                raise InvalidTypeError(f"{self._sampler_column} must hold mappings of sampler settings, "
                                       f"got {type(settings).__name__}")
            given = {k: v for k, v in settings.items() if v is not None}
            unknown = sorted(set(given) - _SAMPLER_FIELDS)
            if unknown:
                raise InvalidArgumentError(f"{self._sampler_column}: unknown sampler settings {unknown}")
            if given:
                sampler = _make_sampler({**self._sampler_fields, **given}, str(self._sampler_column))
        if self._seed_column is not None:
            if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
                raise InvalidTypeError(f"{self._seed_column} must hold an int seed, got "
                                       f"{'None' if seed is None else type(seed).__name__}")
            return dataclasses.replace(sampler, seed=seed)
        if self._key_column is not None:
            return dataclasses.replace(sampler, seed=row_seed(sampler.seed, key))
        return sampler

    def _submit(self, prompt: Any, settings: Any, seed: Any, key: Any) -> Request:
        params = dataclasses.replace(self._params, sampler=self._row_sampler(settings, seed, key))
        return self._model.submit(_prompt(prompt), params=params, special=self._special)

    def __call__(self, batch: Any) -> Any:
        table = _to_table(batch)
        clash = sorted(set(self._names.values()) & set(table.column_names))
        if clash:
            raise ValueError(f"the batch already has columns {clash}: choose an output_prefix")
        prompts = self._column(table, self._prompt_column)
        settings = self._column(table, self._sampler_column)
        seeds = self._column(table, self._seed_column)
        keys = self._column(table, self._key_column)
        errors: list[Optional[str]] = [None] * table.num_rows
        requests: list[Optional[Request]] = []
        # Every row is submitted before any result is read: the engine computes a token of all
        # of them in each forward pass, and each row's bits are those of running it alone.
        try:
            for i, prompt in enumerate(prompts):
                try:
                    requests.append(self._submit(prompt, settings[i], seeds[i], keys[i]))
                except _ROW_ERRORS as error:
                    requests.append(None)
                    errors[i] = f"{type(error).__name__}: {error}"
            results: list[Optional[Completion]] = [r.result() if r is not None else None for r in requests]
        finally:
            for r in requests:
                if r is not None:
                    r.cancel()
        columns: dict[str, Any] = {
            "text": pa.array([c.text if c else None for c in results], pa.string()),
            "token_ids": pa.array([c.token_ids if c else None for c in results], pa.list_(pa.int64())),
            "finish_reason": pa.array([c.finish_reason if c else None for c in results], pa.string()),
            "logprobs": pa.array([c.logprobs if c else None for c in results], pa.list_(pa.float64())),
            "error": pa.array(errors, pa.string()),
        }
        for column, name in self._names.items():
            table = table.append_column(name, columns[column])
        return table


def generate(
    dataset: ray.data.Dataset,
    *,
    model: ModelSpec = "default",
    prompt_column: str = "prompt",
    actors: int = 1,
    threads: int = 1,
    batch_size: int = 64,
    precision: Precision = "float32",
    isa: Optional[str] = None,
    kv_dtype: KvDtype = "f32",
    max_tokens: int = 256,
    sampler: Union[Sampler, Mapping[str, Any], None] = None,
    stop: Union[str, Sequence[str]] = (),
    stop_token_ids: Sequence[int] = (),
    special: bool = True,
    logprobs: bool = False,
    sampler_column: Optional[str] = None,
    seed_column: Optional[str] = None,
    key_column: Optional[str] = None,
    output_prefix: str = "",
    **ray_remote_args: Any,
) -> ray.data.Dataset:
    """``dataset`` (a ``ray.data.Dataset``) with a completion for each row: a lazy
    ``ray.data.Dataset`` whose rows carry the output columns (see the module's documentation).

    ``actors`` actors (a fixed pool), each with the model loaded with ``threads`` threads and
    ``threads`` CPUs reserved, take batches of ``batch_size`` rows and run each batch's rows
    together on the batch engine. The other options are :class:`Predictor`'s; the rest
    (``ray_remote_args``, such as ``memory=`` or ``max_restarts=``) go to ``map_batches``. The
    settings are checked here, before any actor starts. Ray Data restarts an actor that dies
    and retries its batch (by default without limit); the rows come out the same.
    """
    if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
        raise InvalidArgumentError(f"actors must be an int >= 1, got {actors!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidArgumentError(f"threads must be an int >= 1, got {threads!r}")
    if seed_column is not None and key_column is not None:
        raise InvalidArgumentError("give seed_column or key_column, not both")
    fields = _sampler_fields(sampler)
    GenerationParams(max_tokens=max_tokens, sampler=_make_sampler(fields, "sampler"), stop=stop,
                     stop_token_ids=stop_token_ids)
    options = dict(
        model=None if model is None else (model if isinstance(model, str) else os.fspath(model)),
        prompt_column=prompt_column, threads=threads, precision=precision, isa=isa, kv_dtype=kv_dtype,
        max_tokens=max_tokens,
        sampler=fields, stop=stop if isinstance(stop, str) else list(stop), stop_token_ids=list(stop_token_ids),
        special=special, logprobs=logprobs, sampler_column=sampler_column, seed_column=seed_column,
        key_column=key_column, output_prefix=output_prefix,
    )
    return dataset.map_batches(
        Predictor, fn_constructor_kwargs=options, batch_size=batch_size, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=threads, **ray_remote_args,
    )
