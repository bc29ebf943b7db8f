"""Batch generation over Ray Data: a row's output depends only on the row and the
model file, never on the batch size, the number of actors, or an actor dying and being
retried; bad rows get an error value and the others complete; the Ray processes the tests
start are gone afterwards.

One local Ray instance for the module: 2 logical CPUs, its nodes talking over loopback."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow as pa
import pytest
import ray
import ray.data

import reprolm
import reprolm.ray as rray

# Ray Data's own DataContext warns about its deprecated settings on first use.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")

MAX_TOKENS = 5

# Mixed samplers, assigned to rows in turn through the sampler column (None: the default,
# greedy). Per-row seeds are derived from the row id.
SAMPLERS: list[Optional[dict[str, Any]]] = [
    None,
    {"temperature": 0.8},
    {"temperature": 1.0, "top_k": 20},
    {"temperature": 0.7, "top_p": 0.9, "seed": 11},
    {"temperature": 1.2, "min_p": 0.05, "repetition_penalty": 1.3},
    {"temperature": 0.0, "repetition_penalty": 1.5},
    {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "frequency_penalty": 0.5},
]
WORDS = ["river", "number", "castle", "theorem", "bread", "orbit", "violin", "glacier", "market", "engine"]


def prompt_of(i: int) -> str:
    words = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 5))
    return f"{i}. A story about {words}:" if i % 3 else f"Q: what is a {words}? A:"


def rows(n: int = 200) -> list[dict[str, Any]]:
    return [{"id": i, "prompt": prompt_of(i), "sampler": SAMPLERS[i % len(SAMPLERS)]} for i in range(n)]


def row_sampler(row: dict[str, Any]) -> reprolm.Sampler:
    """The sampler a row documents: the default (greedy) with the row's settings, seeded with
    row_seed(its seed, its id)."""
    fields = {"temperature": 0.0, **{k: v for k, v in (row["sampler"] or {}).items() if v is not None}}
    base = reprolm.Sampler(**fields)
    return dataclasses.replace(base, seed=rray.row_seed(base.seed, row["id"]))


@pytest.fixture(scope="module")
def expected(model: reprolm.Model) -> dict[int, tuple[str, list[int], str]]:
    """Each row generated locally on its own (requests submitted together: batch-invariant)."""
    requests = {r["id"]: model.submit(r["prompt"], max_tokens=MAX_TOKENS, sampler=row_sampler(r)) for r in rows()}
    outs = {i: req.result() for i, req in requests.items()}
    # The batch engine's promise, checked here on a few rows: alone, the same bits.
    for r in rows()[:8]:
        alone = model.generate(r["prompt"], max_tokens=MAX_TOKENS, sampler=row_sampler(r))
        assert alone.token_ids == outs[r["id"]].token_ids
    return {i: (c.text, c.token_ids, c.finish_reason) for i, c in outs.items()}


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray instance (never an existing cluster: address="local"), bounded to 2 CPUs and
    loopback; shut down afterwards, and every process it started must be gone."""
    before = _descendants(os.getpid())
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=256 * 2**20, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    # The test module's Predictor subclasses go to the actors by value (workers cannot import it).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield
    finally:
        started = _descendants(os.getpid()) - before
        ray.shutdown()
        deadline = time.monotonic() + 30
        while (left := {p for p in started if _alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started, "ray.init started no process?"
        assert not left, f"Ray processes left running after ray.shutdown(): {sorted(left)}"


class PidPredictor(rray.Predictor):
    """Also records which actor process computed each row, and the reprolm it imported."""

    def __call__(self, batch: Any) -> Any:
        table = super().__call__(batch)
        table = table.append_column("pid", pa.array([os.getpid()] * table.num_rows, pa.int64()))
        return table.append_column("reprolm", pa.array([reprolm.__file__] * table.num_rows, pa.string()))


class DiesOncePredictor(rray.Predictor):
    """The first batch any actor receives kills that actor's process (once: a marker file
    records it); Ray restarts the actor and retries the batch."""

    def __init__(self, *, marker: str, **options: Any) -> None:
        super().__init__(**options)
        self._marker = Path(marker)

    def __call__(self, batch: Any) -> Any:
        try:
            self._marker.open("x").close()
        except FileExistsError:
            return super().__call__(batch)
        os._exit(1)


def outputs(rows_out: list[dict[str, Any]]) -> dict[int, tuple[str, list[int], str]]:
    assert all(r["error"] is None for r in rows_out), [r for r in rows_out if r["error"]][:3]
    return {r["id"]: (r["text"], list(r["token_ids"]), r["finish_reason"]) for r in rows_out}


# Each actor count with two batch sizes, each batch size at least once (the whole grid took
# 20 s more of the suite's 15 minutes and covers no other code path).
@pytest.mark.parametrize(("batch_size", "actors"), [(1, 1), (64, 1), (1, 2), (7, 2)])
def test_same_bits_for_any_actors_and_batch_size(
    cluster: None, expected: dict[int, tuple[str, list[int], str]], actors: int, batch_size: int
) -> None:
    ds = ray.data.from_items(rows())
    out = ds.map_batches(
        PidPredictor, batch_format="pyarrow", batch_size=batch_size, num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=actors),
        fn_constructor_kwargs=dict(max_tokens=MAX_TOKENS, sampler_column="sampler", key_column="id"),
    ).take_all()
    assert len(out) == 200
    assert outputs(out) == expected
    assert {r["prompt"] for r in out} == {r["prompt"] for r in rows()}  # input columns kept
    assert {r["reprolm"] for r in out} == {reprolm.__file__}  # the actors run this reprolm
    if actors == 2 and batch_size < 64:
        assert len({r["pid"] for r in out}) == 2  # both actors did compute rows


def test_generate_helper_and_an_actor_that_dies(
    cluster: None, expected: dict[int, tuple[str, list[int], str]], tmp_path: Path
) -> None:
    marker = tmp_path / "died"
    ds = ray.data.from_items(rows())
    out = ds.map_batches(
        DiesOncePredictor, batch_format="pyarrow", batch_size=16, num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=2),
        fn_constructor_kwargs=dict(marker=str(marker), max_tokens=MAX_TOKENS, sampler_column="sampler",
                                   key_column="id"),
    ).take_all()
    assert marker.exists()  # an actor did die
    assert outputs(out) == expected
    # The helper: the same rows, the same outputs.
    out = rray.generate(ray.data.from_items(rows()), actors=2, batch_size=32, max_tokens=MAX_TOKENS,
                        sampler_column="sampler", key_column="id").take_all()
    assert outputs(out) == expected


def test_bad_rows_get_an_error_and_the_others_complete(cluster: None, model: reprolm.Model) -> None:
    good = [{"id": i, "prompt": prompt_of(i), "seed": 1000 + i, "sampler": {"temperature": 0.9}} for i in range(12)]
    bad = [
        {"id": 100, "prompt": "", "seed": 1, "sampler": None, "error": "EmptyPromptError"},
        {"id": 101, "prompt": None, "seed": 1, "sampler": None, "error": "InvalidTypeError"},
        {"id": 102, "prompt": "x", "seed": 1, "sampler": {"temperature": -1.0}, "error": "InvalidArgumentError"},
        {"id": 103, "prompt": "x", "seed": 1, "sampler": {"top_p": 2.0}, "error": "InvalidArgumentError"},
        {"id": 104, "prompt": "x", "seed": -5, "sampler": None, "error": "InvalidArgumentError"},
        {"id": 105, "prompt": "x", "seed": None, "sampler": None, "error": "InvalidTypeError"},
        {"id": 106, "prompt": "x", "seed": 1, "sampler": {"temperatur": 1.0}, "error": "InvalidArgumentError"},
        {"id": 107, "prompt": " hello" * 9000, "seed": 1, "sampler": None, "error": "ContextOverflowError"},
    ]
    data = good[:5] + [{k: v for k, v in b.items() if k != "error"} for b in bad] + good[5:]
    out = rray.generate(ray.data.from_items(data), actors=1, batch_size=7, max_tokens=MAX_TOKENS,
                        sampler={"temperature": 0.5}, sampler_column="sampler", seed_column="seed").take_all()
    by_id = {r["id"]: r for r in out}
    assert len(by_id) == len(data)
    for b in bad:
        row = by_id[b["id"]]
        assert row["error"].startswith(b["error"] + ": "), row["error"]
        assert row["text"] is None and row["token_ids"] is None and row["finish_reason"] is None
    for g in good:
        row = by_id[g["id"]]
        local = model.generate(g["prompt"], max_tokens=MAX_TOKENS,
                               sampler=reprolm.Sampler(temperature=0.9, seed=g["seed"]))
        assert row["error"] is None
        assert (row["text"], list(row["token_ids"]), row["finish_reason"]) == (
            local.text, local.token_ids, local.finish_reason)


# Without Ray: the class on its own, the seed derivation, the settings checks.


def test_row_seed_is_the_documented_hash() -> None:
    digest = hashlib.sha256(b"7:doc-42").digest()
    assert rray.row_seed(7, "doc-42") == int.from_bytes(digest[:8], "little")
    assert rray.row_seed(0, 5) == rray.row_seed(0, "5") != rray.row_seed(1, 5)
    assert 0 <= rray.row_seed(2**64 - 1, "x") < 2**64
    for key in [1.5, None, True, b"x"]:
        with pytest.raises(reprolm.InvalidTypeError):
            rray.row_seed(0, key)  # type: ignore[arg-type]


def test_predictor_without_ray(model: reprolm.Model) -> None:
    predictor = rray.Predictor(max_tokens=4, logprobs=True, output_prefix="gen_",
                               sampler=reprolm.Sampler(temperature=0.8, seed=3))
    table = pa.table({"prompt": ["Hello", "Hi there"], "text": ["keep", "me"]})
    out = predictor(table).to_pylist()
    assert [r["text"] for r in out] == ["keep", "me"]
    for row in out:
        local = model.generate(row["prompt"], max_tokens=4, sampler=reprolm.Sampler(temperature=0.8, seed=3))
        assert row["gen_text"] == local.text and row["gen_token_ids"] == local.token_ids
        assert row["gen_logprobs"] == local.logprobs and row["gen_error"] is None
    # Token-id prompts, from a mapping of columns (as Ray's "numpy" format gives).
    ids = model.tokenize("Hello")
    out = predictor({"prompt": [ids]}).to_pylist()
    assert out[0]["gen_token_ids"] == model.generate(ids, max_tokens=4,
                                                     sampler=reprolm.Sampler(temperature=0.8, seed=3)).token_ids
    with pytest.raises(ValueError, match="output_prefix"):
        rray.Predictor(max_tokens=4)(table)
    # The model options reach the model: f16 caches give an f16 session's bits.
    f16 = rray.Predictor(max_tokens=4, logprobs=True, kv_dtype="f16", sampler=reprolm.Sampler(temperature=0.8, seed=3))
    assert f16.model.kv_dtype == "f16"
    row = f16(pa.table({"prompt": ["Hello"]})).to_pylist()[0]
    alone = model.session(kv_dtype="f16").generate("Hello", max_tokens=4, sampler=reprolm.Sampler(temperature=0.8, seed=3))
    assert row["logprobs"] == alone.logprobs


def test_settings_are_checked_before_any_actor_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="every node"):
        rray.Predictor(tmp_path / "missing.gguf")
    with pytest.raises(reprolm.InvalidArgumentError, match="not both"):
        rray.generate(None, seed_column="s", key_column="k")
    with pytest.raises(reprolm.InvalidArgumentError, match="temperature"):
        rray.generate(None, sampler={"temperature": -1.0})
    with pytest.raises(reprolm.InvalidArgumentError, match="unknown sampler settings"):
        rray.generate(None, sampler={"temp": 1.0})
    with pytest.raises(reprolm.InvalidArgumentError, match="actors"):
        rray.generate(None, actors=0)


def test_a_sampler_pickles_as_its_settings() -> None:
    sampler = reprolm.Sampler(temperature=0.7, top_p=0.9, logit_bias={13: -2.0}, seed=5)
    assert pickle.loads(pickle.dumps(sampler)) == sampler


def test_a_model_path_missing_on_a_node_fails_clearly(cluster: None, tmp_path: Path) -> None:
    missing = tmp_path / "model.gguf"
    with pytest.raises(Exception, match="every node") as raised:
        rray.generate(ray.data.from_items([{"prompt": "Hello"}]), model=missing, max_tokens=2).take_all()
    assert str(missing) in str(raised.value)
