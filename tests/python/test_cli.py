"""The command line, run as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MODEL_COMMANDS = ["generate", "chat", "inspect", "bench", "serve"]
COMMANDS = [*MODEL_COMMANDS, "download", "quantize", "convert"]


def run(*args: str, stdin: str = "", timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reprolm", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})


def test_help_lists_and_describes_every_command() -> None:
    top = run("--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        sub = run(command, "--help")
        assert sub.returncode == 0 and sub.stdout.startswith("usage: reprolm " + command)
        if command in MODEL_COMMANDS:
            assert "--model" in sub.stdout


def test_generate_streams_the_greedy_reference(generations: list[dict[str, Any]]) -> None:
    g = generations[0]
    out = run("generate", g["prompt"], "-n", "6", "--verbose")
    assert out.returncode == 0, out.stderr
    from reprolm import Model, default_model_path

    expected = Model.load(default_model_path()).detokenize(g["greedy_ids"][:6])
    assert out.stdout == g["prompt"] + expected + "\n"
    assert "finish_reason: length" in out.stderr
    stopped = run("generate", g["prompt"], "-n", "6", "--stop", ".", "--no-echo")
    assert stopped.stdout == " Paris\n"
    f16 = run("generate", g["prompt"], "-n", "24", "--no-echo", "--kv-dtype", "f16")
    alone = Model.load(default_model_path()).session(kv_dtype="f16").generate(g["prompt"], max_tokens=24)
    assert f16.stdout == alone.text + "\n"


def test_chat_keeps_history(generations: list[dict[str, Any]]) -> None:
    # Two turns read from stdin: the second reply depends on the first turn being kept.
    out = run("chat", "-n", "48", stdin="What is the boiling point of water?\n/exit\nnot read\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout == generations[2]["greedy_text"] + "\n"
    two = run("chat", "-n", "16", stdin="What is the capital of France?\nAnd of Italy?\n")
    first, second = two.stdout.splitlines()
    assert first == "The capital of France is Paris."
    assert "Rome" in second
    alone = run("chat", "-n", "16", stdin="And of Italy?\n")
    assert alone.stdout.strip() != second


def test_inspect_prints_metadata_and_tensor_table(model_path: Path) -> None:
    out = run("inspect", "--model", str(model_path))
    assert out.returncode == 0, out.stderr
    assert "general.architecture = \"llama\"" in out.stdout
    assert "272 tensors" in out.stdout
    row = next(line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["blk.0.attn_q.weight"])
    assert row == ["blk.0.attn_q.weight", "Q4_1", "576x576", "207,360"]


def test_bench_reports_speeds_with_progress() -> None:
    out = run("bench", "-p", "16", "-n", "4", "-r", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["prefill", "decode"]
    assert all(float(line.split()[1]) > 0 for line in lines)
    assert "100%" in out.stderr and "5/5" in out.stderr
    assert "float32, f32 KV cache" in out.stderr
    f16 = run("bench", "-p", "16", "-n", "4", "-r", "1", "--precision", "int8", "--kv-dtype", "f16")
    assert f16.returncode == 0, f16.stderr
    assert "int8, f16 KV cache" in f16.stderr


def test_download_prints_the_cached_path(model_path: Path) -> None:
    out = run("download")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{model_path}\n"


def test_download_into_an_empty_cache_shows_progress(tmp_path: Path, model_path: Path) -> None:
    out = run("download", env={"REPROLM_CACHE": str(tmp_path)}, timeout=600)
    assert out.returncode == 0, out.stderr
    fetched = tmp_path / model_path.name
    assert out.stdout == f"{fetched}\n"
    assert fetched.stat().st_size == model_path.stat().st_size
    assert "verifying [" in out.stderr and "100%" in out.stderr


@pytest.mark.parametrize("command", ["generate", "chat", "inspect", "bench", "serve"])
def test_bad_model_path_is_one_clear_line(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "missing.gguf"
    args = [command, "hi"] if command == "generate" else [command]
    out = run(*args, "--model", str(missing))
    assert out.returncode == 1
    assert out.stderr == f"reprolm: error: no such file: {missing}\n"
    assert out.stdout == ""


def test_bad_file_and_bad_settings(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    out = run("inspect", "-m", str(junk))
    assert out.returncode == 1 and out.stderr.startswith("reprolm: error: invalid GGUF file")
    assert len(out.stderr.splitlines()) == 1
    out = run("generate", "hi", "--threads", "0")
    assert out.returncode == 1 and "threads" in out.stderr and len(out.stderr.splitlines()) == 1
    out = run("generate", "hi", "--temperature", "-1")
    assert out.returncode == 1 and "temperature" in out.stderr and len(out.stderr.splitlines()) == 1
    for flag, value in [("--port", "-1"), ("--max-concurrent", "0"), ("--max-queue", "-1"), ("--threads", "0")]:
        out = run("serve", flag, value)
        assert out.returncode == 1 and out.stderr == f"reprolm: error: {flag} must be >= {int(value) + 1}\n", out.stderr


@pytest.mark.parametrize(
    "flags, setting",
    [
        (["--top-p", "1.5"], "top_p"),
        (["--top-p", "0"], "top_p"),
        (["--top-k", "-1"], "top_k"),
        (["--min-p", "2"], "min_p"),
        (["--seed", "-1"], "seed"),
        (["--temperature", "0", "--top-p", "1.5"], "top_p"),
    ],
)
def test_sampling_flags_are_checked_at_any_temperature(flags: list[str], setting: str) -> None:
    # Sampling flags are checked even at the default temperature 0, where they have no effect.
    for command in (["generate", "hi"], ["chat"]):
        out = run(*command, "-n", "1", *flags, stdin="hi\n")
        assert out.returncode == 1, (command, flags, out.stderr)
        assert setting in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_sampling_flags_without_temperature_sample_at_temperature_1() -> None:
    from reprolm import Model, Sampler, default_model_path

    model = Model.load(default_model_path())
    prompt = "Once upon a time"
    greedy = model.generate(prompt, max_tokens=12).text
    for flags, sampler in [
        (["--seed", "5"], Sampler(temperature=1.0, seed=5)),
        (["--top-k", "40"], Sampler(temperature=1.0, top_k=40)),
        (["--top-p", "0.9", "--seed", "2"], Sampler(temperature=1.0, top_p=0.9, seed=2)),
        (["--min-p", "0.05", "--seed", "3"], Sampler(temperature=1.0, min_p=0.05, seed=3)),
    ]:
        sampled = model.generate(prompt, sampler=sampler, max_tokens=12).text
        assert sampled != greedy, flags  # so the test tells sampling from greedy decoding
        out = run("generate", prompt, "-n", "12", "--no-echo", *flags)
        assert out.returncode == 0, out.stderr
        assert out.stdout == sampled + "\n", flags
    # An explicit --temperature 0 is greedy whatever else is given.
    out = run("generate", prompt, "-n", "12", "--no-echo", "--temperature", "0", "--seed", "5")
    assert out.stdout == greedy + "\n"
    helps = run("generate", "--help").stdout
    assert "or 1 if --top-k, --top-p, --min-p or --seed is given" in " ".join(helps.split())


def test_version() -> None:
    import reprolm

    out = run("--version")
    assert out.returncode == 0 and out.stdout == f"reprolm {reprolm.__version__}\n"


def test_every_command_help_has_a_description_in_plain_words() -> None:
    for command in COMMANDS:
        text = run(command, "--help").stdout
        # usage, a blank line, then the description before the argument lists.
        description = text.split("\n\n")[1]
        assert not description.startswith(("positional arguments", "options")), command
        assert not re.search(r"\b(definition|proposition|theorem|chapter)\b", text, re.IGNORECASE), (command, text)
