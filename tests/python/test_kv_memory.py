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
