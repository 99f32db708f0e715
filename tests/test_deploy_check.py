"""rlq.deploy.check_export and ``rlq export --check``: a written export compared with its policy, on given states."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from conftest import circulant_deploy_models
from rlq.deploy import FP32_RTOL, SAME_CODES_RTOL, compile_policy, error_bound
from rlq.deploy.c_build import c_compiler, load_c_policy
from rlq.deploy.check import TIE, check_export
from rlq.deploy.export import export_policy
from rlq.deploy.export_c import CExport
from rlq.faces.cli import main
from rlq.sb3.checkpoint import save_compressed

pytestmark = pytest.mark.skipif(c_compiler() is None, reason="no C compiler (install gcc)")


@pytest.fixture(scope="module")
def models():
    return circulant_deploy_models(seed=5)


def states_of(model, n: int = 200, seed: int = 0) -> np.ndarray:
    """Observations spread over the model's observation space (Pendulum's box, or CartPole's state scale)."""
    rng = np.random.default_rng(seed)
    high = np.minimum(np.abs(model.observation_space.high), 3.0)
    return (rng.uniform(-1.0, 1.0, size=(n, high.size)) * high).astype(np.float32)


def test_fp32_c_and_onnx_exports_are_compared_with_sb3_predict(models, tmp_path):
    from rlq.quant.onnx_backend import OnnxPolicy

    model = models["TD3"]
    states = states_of(model)
    for fmt in ("c", "onnx"):
        export = export_policy(model, tmp_path / fmt, fmt)
        check = check_export(export, model, states)
        (row,) = check.comparisons
        actions = load_c_policy(export)(states) if fmt == "c" else OnnxPolicy(export)(states)
        expected, _ = model.predict(states, deterministic=True)
        difference = np.abs(actions.astype(np.float64) - expected)  # computed here, independently
        assert check.ok and check.observations == len(states)
        assert (
            row.reference == "PyTorch fp32 (SB3 predict)"
            and row.export == {"c": "C fp32", "onnx": "ONNX fp32"}[fmt]
        )
        assert row.max_difference == pytest.approx(difference.max()) and row.mean_difference == pytest.approx(
            difference.mean()
        )
        assert row.tolerance == pytest.approx(FP32_RTOL * 2.0)  # Pendulum's torque bound is 2
        assert "within float32 rounding" in row.line()


def test_an_int8_c_export_is_held_to_its_codes_and_to_the_worst_case_bound(models, tmp_path):
    model = models["TD3"]
    states = states_of(model)
    calibration = states_of(model, 100, seed=1)
    export = export_policy(model, tmp_path / "c", precision="int8", calibration=calibration)
    check = check_export(export, model, states, "int8", calibration=calibration)
    codes, bounded = check.comparisons
    same = compile_policy(model, "int8", calibration=calibration, use_kernels=False)
    actions = load_c_policy(export)(states)
    assert codes.max_difference == pytest.approx(np.abs(actions - same(states)).max())
    assert codes.tolerance == pytest.approx(SAME_CODES_RTOL * 2.0) and codes.within
    _, bound = error_bound(model, same, states)
    expected, _ = model.predict(states, deterministic=True)
    assert bounded.max_difference == pytest.approx(np.abs(actions - expected).max())
    assert bounded.tolerance == pytest.approx(float((bound + FP32_RTOL * 2.0).max())) and bounded.within
    assert check.ok


def test_a_changed_weight_code_fails_the_check(models, tmp_path):
    model = models["TD3"]
    states = states_of(model)
    export = export_policy(model, tmp_path / "c", precision="int8")
    source = export.source.read_text()
    found = re.search(r"static const int8_t policy_l0_codes\[\d+\] = \{\n    (-?\d+),", source)
    code = int(found.group(1))
    export.source.write_text(
        source[: found.start(1)] + str(code - 60 if code > 0 else code + 60) + source[found.end(1) :]
    )
    check = check_export(CExport.read(export.folder), model, states, "int8")
    codes = check.comparisons[0]
    assert not check.ok and not codes.within and codes.max_difference > 10 * codes.tolerance
    assert "NOT within summation order" in codes.line()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_discrete_actions_are_counted(models, precision, tmp_path):
    model = models["DQN"]
    states = states_of(model)
    export = export_policy(model, tmp_path / "c", precision=precision)
    check = check_export(export, model, states, precision)
    chosen = load_c_policy(export)(states)[:, 0].astype(np.int64)
    expected, _ = model.predict(states, deterministic=True)
    if precision == "fp32":
        (row,) = check.comparisons
        assert row.states_within == pytest.approx(np.mean(chosen == expected)) and row.tolerance == 0.0
    else:
        codes, pytorch = check.comparisons
        outputs = compile_policy(model, "int8", use_kernels=False).outputs(states)
        top2 = np.sort(outputs, axis=1)[:, -2:]
        untied = top2[:, 1] - top2[:, 0] > TIE
        assert codes.states == int(untied.sum()) > 0 and codes.within
        assert pytorch.tolerance is None and pytorch.states_within == pytest.approx(
            np.mean(chosen == expected)
        )
        assert "the same action on" in pytorch.line() and "no tolerance" in pytorch.line()
    assert check.ok


def test_an_onnx_int8_export_is_compared_without_a_tolerance(models, tmp_path):
    model = models["TD3"]
    states = states_of(model)
    path = export_policy(model, tmp_path / "onnx", "onnx", precision="int8", calibration=states)
    (row,) = check_export(path, model, states, "int8", calibration=states).comparisons
    assert row.export == "ONNX int8" and row.tolerance is None and row.within


def test_an_nn_module_actor_is_compared_with_its_post_processed_forward(tmp_path):
    from gymnasium import spaces

    torch.manual_seed(2)
    actor = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh())
    box = spaces.Box(low=np.array([-1.0, 0.0], np.float32), high=np.array([3.0, 0.5], np.float32))
    x = np.random.default_rng(4).normal(size=(50, 5)).astype(np.float32)
    export = export_policy(actor, tmp_path / "c", precision="int8", action_space=box)
    check = check_export(export, actor, x, "int8", action_space=box)
    with torch.no_grad():
        expected = box.low + 0.5 * (actor(torch.from_numpy(x)).numpy() + 1.0) * (box.high - box.low)
    assert check.comparisons[1].reference == "PyTorch fp32"
    assert check.comparisons[1].max_difference == pytest.approx(
        np.abs(load_c_policy(export)(x) - expected).max(), abs=1e-6
    )
    assert check.ok
    with pytest.raises(ValueError, match=r"shape \(n, 5\)"):
        check_export(export, actor, x[:, :4], "int8", action_space=box)
    with pytest.raises(ValueError, match="finite"):
        check_export(export, actor, np.where(x > 2, np.nan, x), "int8", action_space=box)


def test_cli_checks_the_written_files_and_refuses_bad_states_before_writing(
    models, tmp_path, capsys, monkeypatch
):
    model = models["TD3"]
    save_compressed(model, tmp_path / "td3.zip")
    np.save(tmp_path / "states.npy", states_of(model))
    args = ["export", str(tmp_path / "td3.zip"), "--precision", "int8", "--check"]
    assert main([*args, str(tmp_path / "states.npy"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "checked on 200 observations:" in out
    assert (
        "C int8 against rlq's forward of the same codes" in out and "within the int8 worst-case bound" in out
    )
    np.save(tmp_path / "narrow.npy", states_of(model)[:, :2])
    assert main([*args, str(tmp_path / "narrow.npy"), "--out", str(tmp_path / "narrow")]) == 2
    assert "shape (n, 3)" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "missing.npy"), "--out", str(tmp_path / "missing")]) == 2
    assert "no check file at" in capsys.readouterr().err
    monkeypatch.setattr("rlq.deploy.c_build.c_compiler", lambda: None)
    assert main([*args, str(tmp_path / "states.npy"), "--out", str(tmp_path / "nocc")]) == 2
    err = capsys.readouterr().err
    assert "no C compiler found" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["out"]
