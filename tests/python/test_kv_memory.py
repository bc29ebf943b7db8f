"""The batch engine's KV memory through ``Model.submit`` on the tiny synthetic model: when
``kv_memory`` runs out, running sequences are preempted and recomputed, every request still
completes with the bits it gives alone, and ``EngineStats`` counts the preemptions and the
blocks (docs/kv-memory.md)."""

from __future__ import annotations

from pathlib import Path

import reprolm

TINY = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "tiny.Q4_K_M.gguf"


def test_an_exhausted_kv_memory_preempts_without_changing_a_result() -> None:
    alone = reprolm.Model.load(TINY, threads=1, prefix_cache_bytes=0)
    per_position = alone.kv_bytes_per_position
    tight = reprolm.Model.load(TINY, threads=2, kv_memory=600 * per_position, prefix_cache_bytes=0)
    prompts = [[1] + [(17 * i + 5 * j) % 380 + 2 for j in range(30 + i)] for i in range(12)]
    options = [{"max_tokens": 90, "logprobs": 2,
                "sampler": reprolm.Sampler(temperature=0.8, seed=i) if i % 2 else reprolm.Sampler(temperature=0)}
               for i in range(12)]
    # 12 sequences of up to 131 positions: about 1,400 in a budget of 600.
    requests = [tight.submit(p, **o) for p, o in zip(prompts, options)]
    results = [r.result() for r in requests]
    stats = tight.engine_stats()
    assert stats.preemptions > 0, stats
    assert (stats.running, stats.kv_bytes, stats.kv_blocks_used, stats.kv_blocks_free) == (0, 0, 0, 600 // 16), stats
    for i, (p, o, got) in enumerate(zip(prompts, options, results)):
        assert got == alone.generate(p, **o), f"request {i}"


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_the_pool_commits_only_the_blocks_written() -> None:
    # The pool is reserved at once; its pages must become resident only as blocks are written
    # (a pool of 2 GiB on a machine that runs this suite would otherwise show in RSS).
    before = resident_bytes()
    model = reprolm.Model.load(TINY, threads=1, kv_memory=2 << 30)
    model.submit([1, 5, 9, 13], max_tokens=20).result()
    grown = resident_bytes() - before
    stats = model.engine_stats()
    assert stats.passes > 0 and stats.kv_blocks_free == (2 << 30) // (16 * model.kv_bytes_per_position), stats
    assert grown < 256 << 20, f"resident memory grew by {grown >> 20} MiB"
