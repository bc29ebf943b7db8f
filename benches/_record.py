"""The JSON record every benchmark script writes beside what it prints: the command, the
machine, the commit and the numbers, so that the documentation's benchmark page can be rendered
from data (``python scripts/render_benchmarks.py``).

Records go to ``benches/records/`` (or ``$REPROLM_BENCH_RECORDS``), one file per run, named
after the benchmark and the time it finished."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from _machine import cpu_model, cpu_name, simd

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benches" / "records"


def records_dir() -> Path:
    return Path(os.environ.get("REPROLM_BENCH_RECORDS") or RECORDS)


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command() -> str:
    """The command line that ran the script, as typed from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    return shlex.join(["python", shown, *sys.argv[1:]])


def write(benchmark: str, results: dict[str, Any], *, model: Optional[str] = None) -> Path:
    """Writes one record of `benchmark` (the script's name without ``.py``) and returns its path.

    `results` is what the script measured, in the units its table prints; `model` names the
    model file it measured (its file name), where it measured one."""
    import reprolm

    now = datetime.datetime.now(datetime.timezone.utc)
    status = _git("status", "--porcelain", "--untracked-files=no")
    record = {
        "benchmark": benchmark,
        "command": command(),
        "cpu": cpu_name(),
        "cpu_model": cpu_model(),
        "simd": simd(),
        "cpus": os.cpu_count(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "reprolm": reprolm.__version__,
        "model": model,
        "finished": now.isoformat(timespec="seconds"),
        "results": results,
    }
    directory = records_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{benchmark}-{now:%Y%m%dT%H%M%SZ}-{os.getpid()}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {path}", file=sys.stderr)
    return path
