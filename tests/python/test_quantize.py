"""The quantization tool (quantize, convert, report): bit-exactness with
ggml's reference rules as the `gguf` package implements them, valid output per the `gguf`
reader, the report against the uniform quantizer's error bound (docs/theory.md), generation from quantized models, the CLI, and
typed errors for bad input."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

import reprolm
from reprolm._quantize import QuantType
from reprolm.cli import main

QTYPES: dict[QuantType, gguf.GGMLQuantizationType] = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quantize")


@pytest.fixture(scope="module")
def source_reader(model_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(model_path)


@pytest.fixture(scope="module")
def q8_0(model_path: Path, out_dir: Path) -> tuple[Path, reprolm.QuantizeReport]:
    dst = out_dir / "q8_0.gguf"
    return dst, reprolm.quantize(model_path, dst, type="q8_0", report_text=reprolm._quantize.SAMPLE_TEXT)


@pytest.fixture(scope="module")
def q4_0(model_path: Path, out_dir: Path) -> tuple[Path, reprolm.QuantizeReport]:
    dst = out_dir / "q4_0.gguf"
    return dst, reprolm.quantize(model_path, dst, type="q4_0", report_text=reprolm._quantize.SAMPLE_TEXT)


def special_blocks(rng: np.random.Generator) -> np.ndarray:
    """Blocks that exercise the edge cases of the rounding rules."""
    blocks = [
        np.zeros(32),
        np.full(32, 0.1),
        np.full(32, -3.0),
        np.linspace(-1, 1, 32),
        np.linspace(-8, 7, 32),  # Q4_0 codes exactly on x/d + 8.5 = integer + 0.5
        np.arange(32) - 10.0,
        -(np.arange(32) - 10.0),
        np.where(np.arange(32) % 2 == 0, 1e-6, -1e-6),
        np.where(np.arange(32) == 5, 1000.0, rng.normal(0, 0.01, 32)),  # one outlier
        rng.normal(0, 1e-5, 32) * 1e-2,  # subnormal f16 scales
        np.arange(32) * 2.5 / 127 * 127 / 2.5,  # Q8_0 halves
        np.linspace(-127, 127, 32) / 2,  # d = 0.5: x/d lands on .5 for odd multiples
    ]
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("name", list(QTYPES))
def test_quantize_row_bit_exact_with_gguf(name: QuantType) -> None:
    rng = np.random.default_rng(4)
    values = np.concatenate(
        [special_blocks(rng), rng.normal(0, 0.05, 32 * 2000).astype(np.float32),
         rng.standard_cauchy(32 * 500).astype(np.float32)]
    )
    values = values[np.abs(values) < 6e4]  # keep the f16 scales finite, as ggml needs
    values = values[: len(values) // 32 * 32]
    ours = np.frombuffer(reprolm.quantize_row(values, name), dtype=np.uint8)
    theirs = gguf.quants.quantize(values.reshape(-1, 32), QTYPES[name]).reshape(-1)
    assert np.array_equal(ours, theirs)


def test_real_weights_bit_exact_with_gguf(source_reader: gguf.GGUFReader) -> None:
    for t in source_reader.tensors:
        if t.name not in ("blk.3.attn_k.weight", "blk.3.ffn_down.weight"):
            continue
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        values = reprolm.dequantize(int(t.tensor_type), raw.tobytes())
        for name, qtype in QTYPES.items():
            ours = np.frombuffer(reprolm.quantize_row(values, name), dtype=np.uint8)
            theirs = gguf.quants.quantize(values.reshape(-1, 32), qtype).reshape(-1)
            assert np.array_equal(ours, theirs), (t.name, name)


def field_value(field: gguf.ReaderField) -> object:
    return field.contents()


def check_valid_gguf(path: Path, src: gguf.GGUFReader, expected_file_type: int, matrix_type: gguf.GGMLQuantizationType,
                     output_matrix_type: gguf.GGMLQuantizationType) -> gguf.GGUFReader:
    """All tensors, types, shapes and metadata as expected, per the `gguf` package's reader."""
    out = gguf.GGUFReader(path)
    assert [t.name for t in out.tensors] == [t.name for t in src.tensors]
    for a, b in zip(out.tensors, src.tensors):
        assert list(a.shape) == list(b.shape), a.name
        if len(a.shape) == 1:
            assert a.tensor_type == gguf.GGMLQuantizationType.F32, a.name
        elif a.name in ("token_embd.weight", "output.weight"):
            assert a.tensor_type == output_matrix_type, a.name
        else:
            assert a.tensor_type == matrix_type, a.name
        # The data the reader maps is the data our dequantizer and gguf's agree on.
        raw = np.ascontiguousarray(a.data).view(np.uint8).reshape(-1)
        if a.name.startswith("blk.0.") or a.name == "token_embd.weight":
            ours = reprolm.dequantize(int(a.tensor_type), raw.tobytes())
            theirs = gguf.quants.dequantize(raw, a.tensor_type).reshape(-1)
            assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    keys = [k for k in src.fields if not k.startswith("GGUF.")]
    assert [k for k in out.fields if not k.startswith("GGUF.")] == keys
    for key in keys:
        if key == "general.file_type":
            assert field_value(out.fields[key]) == expected_file_type
        else:
            assert out.fields[key].types == src.fields[key].types, key
            assert field_value(out.fields[key]) == field_value(src.fields[key]), key
    return out


def test_q8_0_output_is_valid_gguf(source_reader: gguf.GGUFReader, q8_0: tuple[Path, reprolm.QuantizeReport]) -> None:
    check_valid_gguf(q8_0[0], source_reader, 7, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q8_0)


def test_q4_0_output_is_valid_gguf(source_reader: gguf.GGUFReader, q4_0: tuple[Path, reprolm.QuantizeReport]) -> None:
    check_valid_gguf(q4_0[0], source_reader, 2, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0)


def test_convert_f16_is_the_dequantized_model_in_f16(
    model_path: Path, source_reader: gguf.GGUFReader, out_dir: Path
) -> None:
    dst = out_dir / "f16.gguf"
    reprolm.convert(model_path, dst, to="f16")
    out = check_valid_gguf(dst, source_reader, 1, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F16)
    for a, b in zip(out.tensors, source_reader.tensors):
        if not a.name.startswith("blk.1.") and a.name != "output_norm.weight":
            continue
        raw = np.ascontiguousarray(b.data).view(np.uint8).reshape(-1)
        expected = gguf.quants.dequantize(raw, b.tensor_type).reshape(-1)
        if a.tensor_type == gguf.GGMLQuantizationType.F16:
            expected = expected.astype(np.float16)
        assert np.array_equal(np.asarray(a.data).reshape(-1), expected), a.name


def test_uniform_report_against_the_error_bounds(
    model_path: Path, source_reader: gguf.GGUFReader, out_dir: Path
) -> None:
    dst = out_dir / "uniform.gguf"
    report = reprolm.quantize(model_path, dst, type="q4_1", scheme="uniform", output_type="f16")
    # The embedding/output matrix type is selectable; F16 has no step, so it is not reported.
    check_valid_gguf(dst, source_reader, 3, gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.F16)
    assert [t.name for t in report.tensors] == [
        t.name for t in source_reader.tensors if len(t.shape) == 2 and t.name != "token_embd.weight"
    ]
    assert report.kl is None
    for t in report.tensors:
        assert t.frobenius_error <= t.frobenius_bound
        assert t.max_abs_error <= t.max_error_bound
        assert math.isclose(t.frobenius_bound, t.step / 2 * math.sqrt(t.n_values), rel_tol=1e-12)
        assert math.isclose(t.frobenius_estimate, t.step * math.sqrt(t.n_values / 12), rel_tol=1e-12)
        if t.type == "Q4_1":
            # The uniform quantizer with the stored scales: nothing outside the levels, nothing over d/2.
            assert (t.n_outside, t.n_over_bound, t.n_clipped) == (0, 0, 0), t.name
            assert t.bound_ratio <= 1.0
            # The uniform-error model fits within a few percent.
            assert 0.9 < t.frobenius_error / t.frobenius_estimate < 1.05, t.name
    clipped = reprolm.quantize(model_path, out_dir / "clip.gguf", type="q4_1", scheme="uniform", clip=90)
    q = [t for t in clipped.tensors if t.type == "Q4_1"]
    assert all(t.n_clipped > 0 for t in q)
    # With a = the 90th percentile the step shrinks, at the price of clipping the tail.
    by_name = {t.name: t for t in report.tensors}
    assert all(t.step < by_name[t.name].step for t in q)


def test_report_shows_q4_0_clipping_the_opposite_extreme(q4_0: tuple[Path, reprolm.QuantizeReport]) -> None:
    report = q4_0[1]
    q = [t for t in report.tensors if t.type == "Q4_0"]
    # ggml's Q4_0 levels span [-8d, 7d]: values beyond 7|d| on the other side are clipped.
    assert all(t.n_outside > 0 for t in q)
    assert max(t.max_abs_error / t.max_error_bound for t in q) > 1.5


def test_kl_orders_q8_0_below_q4_0(q8_0: tuple[Path, reprolm.QuantizeReport],
                                   q4_0: tuple[Path, reprolm.QuantizeReport]) -> None:
    k8, k4 = q8_0[1], q4_0[1]
    assert k8.kl is not None and k4.kl is not None
    assert k8.kl_positions == k4.kl_positions > 40
    assert 0 < k8.kl < k4.kl
    assert k8.kl_max is not None and k8.kl_max >= k8.kl


@pytest.mark.parametrize("which", ["q8_0", "q4_0"])
def test_quantized_models_generate(which: str, request: pytest.FixtureRequest) -> None:
    path, _ = request.getfixturevalue(which)
    model = reprolm.Model.load(path)
    completion = model.generate("The capital of France is", max_tokens=8)
    assert len(completion.token_ids) == 8 and completion.text.strip()
    if which == "q8_0":
        assert "Paris" in completion.text


def test_cli_quantize_report_and_convert(model_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = out_dir / "cli.gguf"
    assert main(["quantize", str(model_path), str(dst), "--type", "q8_0", "--report-text", "Hello there, world."]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and "mean KL" in out and f"wrote {dst}" in out
    info = reprolm.inspect(dst)
    assert info.metadata["general.file_type"] == "7"
    assert {t.type for t in info.tensors} == {"Q8_0", "F32"}
    f16 = out_dir / "cli-f16.gguf"
    assert main(["convert", str(model_path), str(f16), "--to", "f16"]) == 0
    assert {t.type for t in reprolm.inspect(f16).tensors} == {"F16", "F32"}
    assert main(["quantize", str(model_path), str(dst), "--type", "q9_9"]) == 1
    assert "type" in capsys.readouterr().err


def test_cli_warns_when_requantizing(model_path: Path, out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Q4_1 to Q8_0 requantizes already quantized weights: the CLI must say so.
    assert main(["quantize", str(model_path), str(out_dir / "requantized.gguf"), "--type", "q8_0"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("reprolm: warning: ") and "already quantized (Q4_1, Q8_0)" in err
    assert "compounds" in err and len(err.splitlines()) == 1
    f16 = out_dir / "warn-f16.gguf"
    reprolm.convert(model_path, f16, to="f16")
    assert main(["quantize", str(f16), str(out_dir / "from-f16.gguf"), "--type", "q8_0"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"type": "q5_k"}, "type"),
        ({"type": "f16"}, "type"),
        ({"scheme": "fancy"}, "scheme"),
        ({"type": "q8_0", "scheme": "uniform"}, "scheme"),
        ({"scheme": "uniform", "clip": 0}, "clip"),
        ({"scheme": "uniform", "clip": -5}, "clip"),
        ({"scheme": "uniform", "clip": 100.01}, "clip"),
        ({"scheme": "uniform", "clip": float("nan")}, "clip"),
        ({"clip": 99}, "clip"),
        ({"output_type": "q6_k"}, "output_type"),
        ({"report_text": ""}, "report_text"),
    ],
)
def test_bad_settings_raise_invalid_argument(model_path: Path, tmp_path: Path, kwargs: dict, setting: str) -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match=f"'{setting}'"):
        reprolm.quantize(model_path, tmp_path / "x.gguf", **kwargs)
    assert not (tmp_path / "x.gguf").exists()


def test_bad_paths_raise_os_errors(model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        reprolm.quantize(model_path, tmp_path / "missing" / "x.gguf")
    with pytest.raises(IsADirectoryError):
        reprolm.quantize(model_path, tmp_path)
    with pytest.raises(PermissionError):
        reprolm.convert(model_path, Path("/sys/reprolm-test.gguf"))
    with pytest.raises(FileNotFoundError):
        reprolm.quantize(tmp_path / "nope.gguf", tmp_path / "x.gguf")
    with pytest.raises(reprolm.InvalidArgumentError, match="source"):
        reprolm.quantize(model_path, model_path)
    with pytest.raises(reprolm.InvalidArgumentError, match="'to'"):
        reprolm.convert(model_path, tmp_path / "x.gguf", to="q8_0")  # type: ignore[arg-type]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0) + b"\0" * 40)  # impossible tensor count
    with pytest.raises(reprolm.GgufFormatError):
        reprolm.quantize(bad, tmp_path / "x.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]  # no temp files left


def test_quantize_row_rejects_bad_values() -> None:
    with pytest.raises(reprolm.InvalidArgumentError, match="not finite"):
        reprolm.quantize_row(np.full(32, np.nan, dtype=np.float32), "q8_0")
    with pytest.raises(reprolm.InvalidArgumentError, match="whole blocks"):
        reprolm.quantize_row(np.zeros(33, dtype=np.float32), "q4_1")
    with pytest.raises(reprolm.InvalidArgumentError, match="f16"):
        reprolm.quantize_row(np.full(32, 1e9, dtype=np.float32), "q8_0")
