"""A one-minute soak of ``reprolm serve`` with faults (``benches/soak.py``'s :func:`run`):
mixed concurrent traffic, clients that disconnect mid-stream and before the first byte, a
slow reader, oversized and malformed bodies, a burst beyond ``--max-queue``, then SIGTERM
with streams in flight. No status but the documented ones, every completed answer identical
to the same request alone, the engine idle (0 running, waiting, in flight, KV bytes) after
every round, no growth of RSS, threads or fds across rounds, and a graceful shutdown."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 60


def _soak():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benches" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


def test_soak_one_minute(model_path: Path, tmp_path: Path) -> None:
    soak = _soak()
    stats = soak.run(model_path, SECONDS, tmp_path / "server.log")
    out = soak.report(stats)
    print(out)
    assert stats.failures == [], "\n".join(stats.failures)
    # everything it claims to check was exercised
    assert len(stats.rounds) >= 2
    for kind in ("disconnect mid-stream", "disconnect before first byte", "slow reader", "oversized body",
                 "malformed body", "burst beyond max-queue", "SIGTERM with streams in flight"):
        assert stats.faults[kind] >= 1, kind
    assert stats.statuses["burst 429"] >= 1 and stats.statuses["burst 200"] >= 1
    assert stats.statuses["mixed 200"] >= 10
    assert stats.compared >= 20 and stats.compared_bytes > 0
    assert not any(key.endswith(("500", "502", "503", "504")) for key in stats.statuses)
    assert stats.shutdown["finished"] == stats.shutdown["in_flight"] > 0
    assert stats.shutdown["exit_code"] == 0
