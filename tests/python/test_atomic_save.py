"""Session files are written atomically: a process killed while saving never leaves
a half-written file under the target name; the file there is always a whole, loadable state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import reprolm

SAVER = """
import sys, reprolm
model = reprolm.Model.load(sys.argv[1], threads=1)
session = model.session(context_length=1024)
session.prefill(list(range(100, 900)))
for i in range(1000):
    session.save(sys.argv[2])
    print(i, flush=True)
"""


def test_a_killed_save_never_leaves_a_broken_file(model_path: Path, tmp_path: Path) -> None:
    target = tmp_path / "session.bin"
    model = reprolm.Model.load(model_path, threads=1)
    for kill_after in (0.05, 0.13, 0.21, 0.34):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(model_path), str(target)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert saver.stdout is not None
            saver.stdout.readline()  # one save has completed; later ones replace it
            time.sleep(kill_after)   # ... and the kill lands in the middle of one of them
            saver.send_signal(signal.SIGKILL)
        finally:
            saver.wait(30)
        restored = reprolm.Session.load(model, target)
        assert restored.tokens == list(range(100, 900))
        assert os.path.getsize(target) > 800 * model.kv_bytes_per_position
