"""Benchmark results as data: each benches/*.py script writes a JSON record of its run, and
scripts/render_benchmarks.py renders the docs' benchmark page (tables and plots) from the
latest records."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ROOT / "benches"
RECORDS = BENCHES / "records"


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = load_module(ROOT / "scripts" / "render_benchmarks.py", "render_benchmarks")


def test_every_benchmark_script_writes_a_record() -> None:
    scripts = sorted(p for p in BENCHES.glob("*.py") if not p.name.startswith("_"))
    assert len(scripts) >= 8
    for script in scripts:
        source = script.read_text()
        assert f'write_record("{script.stem}"' in source, script.name
        assert script.stem in render.TABLES, f"no table for {script.stem}'s records"


def test_the_page_is_rendered_from_the_records() -> None:
    assert render.main(["--check"]) == 0
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "(no record of" not in page
    for name in ("reprolm-vs-llamacpp.png", "speed-vs-model-size.png", "throughput-vs-concurrency.png"):
        assert f"(images/benchmarks/{name})" in page
        assert (ROOT / "docs" / "images" / "benchmarks" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_committed_records_are_complete() -> None:
    records = render.load(RECORDS)
    assert {r["benchmark"] for r in records} >= {"compare_llamacpp", "batch_throughput", "server_throughput",
                                                 "grammar_mask", "speculative", "ray_throughput"}
    for r in records:
        assert r["command"].startswith(f"python benches/{r['benchmark']}.py"), r["_file"]
        assert r["cpu"] and r["cpus"] >= 1 and r["results"], r["_file"]
        assert r.get("transcribed") or re.fullmatch(r"[0-9a-f]{40}", r["commit"] or ""), r["_file"]


def compare_record(finished: str, decode: float, precision: str = "float32") -> dict[str, Any]:
    metrics = {"prefill tok/s": 500.0, "decode tok/s": decode, "ttft ms": 100.0, "load ms": 100.0,
               "peak RSS MiB": 190.0}
    theirs = {**metrics, "decode tok/s": 100.0}
    return {"benchmark": "compare_llamacpp", "command": "python benches/compare_llamacpp.py --threads 2",
            "cpu": "Test CPU", "cpus": 2, "commit": "ab" * 20, "dirty": False, "reprolm": "0.1.0",
            "model": "m.gguf", "finished": finished,
            "results": {"precision": precision, "rounds": 3, "model_bytes": 10**8,
                        "by_threads": [{"threads": 2, "medians": {"reprolm": metrics, "llama.cpp": theirs},
                                        "reprolm_over": {"llama.cpp": {k: metrics[k] / theirs[k] for k in metrics}}}]}}


def test_the_latest_record_of_each_configuration_is_rendered(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    for i, record in enumerate([compare_record("2026-01-02T00:00:00+00:00", 123.4),
                                compare_record("2026-01-01T00:00:00+00:00", 111.1),
                                compare_record("2026-01-03T00:00:00+00:00", 234.5, "int8")]):
        (records / f"compare_llamacpp-{i}.json").write_text(json.dumps(record))
    page = tmp_path / "page.md"
    page.write_text("Intro.\n\n<!-- records: compare_llamacpp precision=float32 -->\nstale\n"
                    "<!-- /records: compare_llamacpp -->\n\n<!-- records: grammar_mask -->\n"
                    "<!-- /records: grammar_mask -->\nEnd.\n")
    images = tmp_path / "images"
    args = ["--records", str(records), "--page", str(page), "--images", str(images)]
    assert render.main([*args, "--check"]) == 1
    assert render.main(args) == 0
    text = page.read_text()
    assert text.startswith("Intro.\n\n") and text.endswith("End.\n") and "stale" not in text
    assert "123.4" in text and "1.234x" in text  # the later of the two float32 runs
    assert "111.1" not in text and "234.5" not in text  # the earlier run; the int8 one is filtered out
    assert "`python benches/compare_llamacpp.py --threads 2` on Test CPU (2 CPUs); commit abababababab" in text
    assert "(no record of `benches/grammar_mask.py` yet)" in text
    assert render.main([*args, "--check"]) == 0
    for name in render.PLOTS:
        png = (images / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, name


def test_runs_on_two_kinds_of_machine_are_both_kept(tmp_path: Path) -> None:
    """The same configuration measured on CPUs of two vendors with one SIMD level: neither run
    replaces the other, and a ``cpu=`` filter picks a vendor's."""
    records = tmp_path / "records"
    records.mkdir()
    amd = {**compare_record("2026-01-01T00:00:00+00:00", 123.4), "cpu": "AMD EPYC", "simd": "avx512_vnni"}
    intel = {**compare_record("2026-01-02T00:00:00+00:00", 234.5), "cpu": "Intel(R) Xeon(R) Processor",
             "simd": "avx512_vnni"}
    for i, record in enumerate([amd, intel]):
        (records / f"compare_llamacpp-{i}.json").write_text(json.dumps(record))
    assert len(render.latest(render.load(records))["compare_llamacpp"]) == 2
    page = tmp_path / "page.md"
    page.write_text("<!-- records: compare_llamacpp cpu=AMD simd=avx512_vnni -->\n"
                    "<!-- /records: compare_llamacpp -->\n<!-- records: compare_llamacpp cpu=Intel -->\n"
                    "<!-- /records: compare_llamacpp -->\n")
    assert render.main(["--records", str(records), "--page", str(page), "--images", str(tmp_path / "images")]) == 0
    amd_part, intel_part = page.read_text().split("<!-- records: compare_llamacpp cpu=Intel -->")
    assert "123.4" in amd_part and "234.5" not in amd_part
    assert "234.5" in intel_part and "123.4" not in intel_part


def test_a_benchmark_run_writes_a_record_the_page_can_show(tmp_path: Path) -> None:
    """benches/kl_vs_reference.py (seconds) run for real: its record names the command, the CPU
    and the commit, and holds what it printed."""
    env = {**os.environ, "REPROLM_BENCH_RECORDS": str(tmp_path)}
    out = subprocess.run([sys.executable, str(BENCHES / "kl_vs_reference.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    (path,) = tmp_path.glob("kl_vs_reference-*.json")
    record = json.loads(path.read_text())
    machine = load_module(BENCHES / "_machine.py", "_machine_for_test")
    assert record["command"] == "python benches/kl_vs_reference.py"
    assert record["cpu"] == machine.cpu_name() and record["cpus"] == os.cpu_count()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert record["commit"] == (head or None) and record["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    engines = record["results"]["engines"]
    assert engines["reprolm float32"]["mean_kl"] < 1e-9 < engines["reprolm int8"]["mean_kl"]
    table = render.TABLES["kl_vs_reference"](record)
    for line in out.splitlines()[:3]:
        assert line in table, line
