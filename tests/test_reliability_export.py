"""What a hostile but fair user tries on export and reuse: every SB3 model file, job folders, damaged
checkpoints, NaN observations in every format, kills and full disks during an export, run folders received
from someone else (pickles, NaN metrics). Each gets its intended behaviour or one line naming the problem."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import DEPLOY_ALGOS, DEPLOY_DISCRETE, run_cli
from rlq.core.jsonio import write_json
from rlq.deploy import compile_policy, export_policy, load_c_policy
from rlq.deploy.c_build import c_compiler
from rlq.faces.cli import main
from rlq.rl.agents import make_model
from rlq.rl.parallel import ResultStore
from rlq.sb3.checkpoint import save_compressed

needs_cc = pytest.mark.skipif(c_compiler() is None, reason="no C compiler (install gcc)")
FORMATS = [
    ("c", "fp32"), ("c", "int8"), ("c", "int4"), ("c", "int2"),
    ("onnx", "fp32"), ("onnx", "int8"), ("onnx", "int8 static"),
]  # fmt: skip
"""Every exported format; ONNX int8 is dynamic (what ``rlq export`` writes) or static (calibrated QDQ)."""


@pytest.fixture(scope="module")
def models():
    """Untrained models of the six algorithms with a 16-unit action path."""
    return {
        algo: make_model(algo, env_id, seed=1, hyperparams=dict(policy_kwargs=dict(net_arch=[16])))
        for algo, env_id in DEPLOY_ALGOS.items()
    }


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- every SB3 model file exports


@needs_cc
@pytest.mark.parametrize("algo", list(DEPLOY_ALGOS))
@pytest.mark.parametrize("written_by", ["sb3", "save_compressed"])
def test_every_algorithms_model_file_exports(models, algo, written_by, tmp_path, capsys):
    model = models[algo]
    path = tmp_path / "model.zip"
    model.save(path) if written_by == "sb3" else save_compressed(model, path)
    assert main(["export", str(path), "--out", str(tmp_path / "c"), "--precision", "int8"]) == 0, (
        capsys.readouterr()
    )
    obs = np.random.default_rng(0).normal(size=(16, model.observation_space.shape[0])).astype(np.float32)
    expected = compile_policy(model, "int8")(obs)
    got = load_c_policy(tmp_path / "c")(obs)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=0, atol=1e-4)


def test_a_model_file_of_another_library_or_damaged_is_refused_in_one_line(models, tmp_path, capsys):
    import zipfile

    path = tmp_path / "model.zip"
    models["TD3"].save(path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp_path / "contrib.zip", "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "data":
                meta = json.loads(data)
                meta["policy_class"]["__module__"] = "sb3_contrib.tqc.policies"
                data = json.dumps(meta).encode()
            dst.writestr(item, data)
    assert main(["export", str(tmp_path / "contrib.zip"), "--out", str(tmp_path / "a")]) == 2
    assert "not from Stable-Baselines3" in _one_line_error(capsys)
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["export", str(truncated), "--out", str(tmp_path / "b")]) == 2
    assert "not a Stable-Baselines3 model file" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contrib.zip", "model.zip", "truncated.zip"]


# ---- job folders and damaged checkpoints


@pytest.fixture(scope="module")
def job_folder(tmp_path_factory):
    """An experiment's run folder holding one trained TD3 job (checkpoints at 100 and 200 steps)."""
    from rlq.rl.agents import make_model
    from rlq.sb3 import GSTCallback
    from rlq.sb3.checkpoint import CompressedCheckpoints

    run = tmp_path_factory.mktemp("gst_td3_mujoco") / "20260101T000000Z-abcdef"
    job = run / "runs" / "Pendulum-v1__gst__0"
    gst = GSTCallback(block_schedule=[(0.0, 4)])
    checkpoints = CompressedCheckpoints(job, every=100)
    hyperparams = dict(learning_starts=50, batch_size=16, policy_kwargs=dict(net_arch=[16, 16]))
    model = checkpoints.resume(make_model("TD3", "Pendulum-v1", seed=0, hyperparams=hyperparams), [gst])
    model.learn(200, callback=[gst, checkpoints], reset_num_timesteps=False)
    assert (job / "checkpoints" / "model_200_steps.zip").is_file() and not (job / "params.json").exists()
    return job


def test_a_job_folder_and_the_run_folder_holding_it_export(job_folder, tmp_path, capsys):
    assert main(["export", str(job_folder), "--out", str(tmp_path / "job")]) == 0
    assert (
        main(["export", str(job_folder.parent.parent), "--format", "onnx", "--out", str(tmp_path / "run")])
        == 0
    )
    assert (tmp_path / "job" / "policy.c").is_file() and (tmp_path / "run" / "policy.onnx").is_file()
    two = tmp_path / "two"
    for name in ("a", "b"):
        shutil.copytree(job_folder, two / "runs" / name)
    assert main(["export", str(two), "--out", str(tmp_path / "x")]) == 2
    assert "holds 2 trained agents (runs/a, runs/b)" in _one_line_error(capsys)
    assert (
        main(["export", str(tmp_path), "--out", str(tmp_path / "y")]) == 2
    )  # holds no checkpoints/ of its own
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    capsys.readouterr()


def test_a_truncated_newest_checkpoint_falls_back_with_a_warning_then_advice(
    job_folder, tmp_path, capsys, caplog
):
    job = tmp_path / "job"
    shutil.copytree(job_folder, job)
    newest = job / "checkpoints" / "model_200_steps.zip"
    newest.write_bytes(newest.read_bytes()[:3000])
    assert main(["export", str(job), "--out", str(tmp_path / "fallback")]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "model_200_steps.zip" in warning and warning.endswith("using the checkpoint at 100 steps instead")
    older = job / "checkpoints" / "model_100_steps.zip"
    older.write_bytes(older.read_bytes()[:3000])
    assert main(["export", str(job), "--out", str(tmp_path / "none")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("rlq: error: none of the 2 checkpoints in") and "train it again" in last
    assert not (tmp_path / "none").exists()


# ---- non-finite observations: no action, in every format


def _bad_rows(obs_dim: int) -> np.ndarray:
    obs = np.zeros((4, obs_dim), np.float32)
    obs[1, 0], obs[2, 0], obs[3, -1] = np.nan, np.inf, -np.inf
    return obs


@needs_cc
@pytest.mark.parametrize(("fmt", "precision"), FORMATS, ids=[f"{f}-{p}" for f, p in FORMATS])
@pytest.mark.parametrize("algo", ["TD3", "DQN"])
def test_a_non_finite_observation_gives_no_action_in_every_format(models, algo, fmt, precision, tmp_path):
    model = models[algo]
    obs = _bad_rows(model.observation_space.shape[0])
    if fmt == "c":
        policy = load_c_policy(export_policy(model, tmp_path / "out", precision=precision))
        missing = np.nan  # the C function writes every action, a discrete one too, as floats
    else:
        pytest.importorskip("onnxruntime")
        from rlq.quant.onnx_backend import OnnxPolicy

        calibration = np.random.default_rng(0).normal(size=(32, obs.shape[1])).astype(np.float32)
        static = precision.endswith("static")
        path = export_policy(
            model,
            tmp_path / "out",
            "onnx",
            precision=precision.split()[0],
            calibration=calibration if static else None,
        )
        policy = OnnxPolicy(path)
        missing = -1 if algo in DEPLOY_DISCRETE else np.nan
    actions = np.asarray(policy(obs), np.float64).reshape(4, -1)
    np.testing.assert_array_equal(actions[1:], np.full_like(actions[1:], missing))
    # the finite row gets its own action, as alone: dynamic int8 scales a whole batch, NaN rows not included
    alone = np.asarray(policy(obs[:1]), np.float64).reshape(1, -1)
    assert np.isfinite(actions[0]).all() and np.array_equal(actions[0], alone[0])


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("use_kernels", [True, False])
def test_compile_policy_gives_no_action_for_a_non_finite_observation(models, precision, use_kernels):
    for algo in ("TD3", "DQN"):
        policy = compile_policy(models[algo], precision, use_kernels=use_kernels)
        obs = _bad_rows(policy.obs_dim)
        outputs, actions = policy.outputs(obs), policy(obs)
        assert np.isfinite(outputs[0]).all() and np.isnan(outputs[1:]).all()
        if algo in DEPLOY_DISCRETE:
            assert actions[0] >= 0 and (actions[1:] == -1).all()
        else:
            assert np.isfinite(actions[0]).all() and np.isnan(actions[1:]).all()


@needs_cc
def test_a_c_policy_is_loaded_from_its_folder_and_takes_float32_only(models, tmp_path):
    export_policy(models["TD3"], tmp_path / "c")
    policy = load_c_policy(str(tmp_path / "c"))
    obs = np.zeros((2, 3), np.float32)
    assert policy(obs).shape == (2, 1)
    with pytest.raises(TypeError, match="float32 observations, got dtype float64"):
        policy(obs.astype(np.float64))
    with pytest.raises(TypeError, match="float32 observations, got dtype float64"):
        compile_policy(models["TD3"])(obs.astype(np.float64))
    with pytest.raises(FileNotFoundError, match="no exported policy folder at"):
        load_c_policy(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found none; pass name="):
        load_c_policy(tmp_path / "empty")


# ---- export is all or nothing


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fmt", ["c", "onnx"])
def test_a_full_disk_during_an_export_prints_one_line_and_leaves_nothing(
    models, fmt, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("onnxruntime")
    models["TD3"].save(tmp_path / "model.zip")
    if fmt == "c":
        monkeypatch.setattr(Path, "write_text", _enospc)
    else:
        monkeypatch.setattr(shutil, "copyfile", _enospc)  # export_onnx's copy of the finished file
    out = tmp_path / "deep" / "out"
    assert main(["export", str(tmp_path / "model.zip"), "--format", fmt, "--out", str(out)]) == 2
    assert (
        _one_line_error(capsys)
        == f"rlq: error: export to {out} failed: No space left on device; nothing was written"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model.zip"
    ]  # no out, no parent made for it, no staging


def test_an_over_long_out_path_prints_one_line(models, tmp_path, capsys):
    models["TD3"].save(tmp_path / "model.zip")
    for fmt in ("c", "onnx"):
        out = tmp_path / ("x" * 300)
        assert main(["export", str(tmp_path / "model.zip"), "--format", fmt, "--out", str(out)]) == 2
        assert _one_line_error(capsys).endswith("failed: File name too long; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]


def test_an_interrupted_onnx_export_leaves_no_folder_and_the_retry_works(
    models, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("onnxruntime")
    from rlq.quant import onnx_backend

    models["PPO"].save(tmp_path / "model.zip")
    real = onnx_backend._export_fp32

    def interrupted(module, path, *args):
        real(module, path, *args)
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM as the rlq command turns it into one

    monkeypatch.setattr(onnx_backend, "_export_fp32", interrupted)
    out = tmp_path / "onnx"
    assert main(["export", str(tmp_path / "model.zip"), "--format", "onnx", "--out", str(out)]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]
    monkeypatch.setattr(onnx_backend, "_export_fp32", real)
    assert main(["export", str(tmp_path / "model.zip"), "--format", "onnx", "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["policy.onnx"]
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["c", "onnx"])
def test_a_kill_at_any_moment_leaves_the_folder_whole_or_absent(models, fmt, tmp_path):
    """SIGKILL at points spread over the command's life: --out is absent or complete, and a retry works."""
    models["SAC"].save(tmp_path / "model.zip")
    command = [sys.executable, "-m", "rlq.faces.cli", "export", str(tmp_path / "model.zip"), "--format", fmt]
    start = time.perf_counter()
    subprocess.run([*command, "--out", str(tmp_path / "timed")], check=True, capture_output=True)
    whole = time.perf_counter() - start
    expected = sorted(p.name for p in (tmp_path / "timed").iterdir())
    for i, fraction in enumerate((0.5, 0.8, 0.9, 0.95, 0.98, 1.0)):
        out = tmp_path / f"killed{i}"
        proc = subprocess.Popen([*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(whole * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not out.exists() or sorted(p.name for p in out.iterdir()) == expected
        if not out.exists():
            done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".rlq-staging-*"))  # what a kill left, the next export removed


# ---- a run folder is data


@pytest.fixture
def published(tmp_path):
    """A copy of a published gst_td3_mujoco run whose seed-2 gst run has a NaN eval_return."""
    from rlq.experiments.results import committed_dir

    folder = tmp_path / "published"
    shutil.copytree(committed_dir("gst_td3_mujoco", "long"), folder)
    summary = pd.read_csv(folder / "summary.csv", float_precision="round_trip")
    summary.loc[(summary.seed == 2) & (summary.method == "gst"), "eval_return"] = np.nan
    summary.to_csv(folder / "summary.csv", index=False)
    return folder


def _params():
    from rlq.experiments.registry import get_experiment

    return get_experiment("gst_td3_mujoco").resolve("long", [("seeds", "[0, 1, 2, 3, 4]")])


def test_reuse_refuses_a_nan_metric_naming_the_seed_the_column_and_the_file(published):
    from rlq.experiments.reuse import plan_reuse

    with pytest.raises(ValueError) as raised:
        plan_reuse([published], "gst_td3_mujoco", _params())
    message = str(raised.value)
    assert (
        "seed 2" in message and "eval_return = nan" in message and str(published / "summary.csv") in message
    )
    assert "--retrain env_id=HalfCheetah-v5,seed=2,method=gst" in message
    ((_, _, runs),) = plan_reuse([published], "gst_td3_mujoco", _params(), ["method=gst,seed=2"])
    assert {"env_id": "HalfCheetah-v5", "seed": 2, "method": "gst"} not in [key for key, _ in runs]


def _run_folder_with_jobs(tmp_path: Path, experiment: str, params: dict) -> Path:
    run = tmp_path / "runs" / experiment / "20260101T000000Z-abcdef"
    (run / "jobs").mkdir(parents=True)
    write_json(run / "params.json", params)
    write_json(run / "results.json", {"experiment": experiment, "status": "failed", "preset": "quick"})
    return run


class _RunsCode:
    """A pickled object that runs code when it is unpickled: it creates a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_reuse_of_a_folder_with_pickled_results_never_unpickles_them(tmp_path, capsys):
    run = _run_folder_with_jobs(tmp_path, "gst_td3_mujoco", _params())
    (run / "results.json").write_text(json.dumps({"experiment": "gst_td3_mujoco", "status": "ok"}))
    marker = tmp_path / "code_ran"
    (run / "jobs" / "seed-0-0123456789.pkl").write_bytes(
        pickle.dumps({"key": {}, "result": _RunsCode(marker)})
    )
    args = ["run", "gst_td3_mujoco", "--preset", "long", "--reuse", str(run), "--out", str(tmp_path / "new")]
    assert main(args) == 2
    line = _one_line_error(capsys)
    assert "saved as pickles (seed-0-0123456789.pkl), which can run code when read" in line
    assert f"rlq migrate-jobs {run}" in line
    assert not marker.exists() and not (tmp_path / "new").exists()


def test_resume_refuses_a_nan_metric_and_a_damaged_result(tiny_notebooks, tmp_path, capsys, monkeypatch):
    from rlq.experiments import runner

    monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail("a kernel was about to start"))
    params = {"x": 2, "scale": 0.5, "label": "a", "flag": False, "sizes": [1, 2], "fail": True}
    run = _run_folder_with_jobs(tmp_path, "tiny", params)
    store = ResultStore(run / "jobs")
    store.save({"seed": 0}, {"summary": {"eval_return": 1.5}})
    path = store.save(
        {"seed": 3}, {"summary": {"eval_return": float("nan")}, "curve": pd.DataFrame({"r": [1.0]})}
    )
    assert main(["run", "--resume", str(run)]) == 2
    line = _one_line_error(capsys)
    assert f"run seed 3 has eval_return = nan in {path}" in line and f"move {path.name} out of" in line
    path.write_text('{"format": "rlq job result", "key": {"seed": 3}, "result": {"__rlq__": "pickle"}}')
    assert main(["run", "--resume", str(run)]) == 2
    assert f"{path} is damaged" in _one_line_error(capsys)


def test_migrate_jobs_converts_trusted_pickles_explicitly(tmp_path, capsys):
    run = _run_folder_with_jobs(tmp_path, "tiny", {})
    frame = pd.DataFrame({"step": [1, 2], "reward": [0.5, np.nan]})
    result = {"summary": {"eval_return": 2.0}, "curve": frame, "pair": (1, 2)}
    (run / "jobs" / "seed-0-x.pkl").write_bytes(pickle.dumps({"key": {"seed": 0}, "result": result}))
    store = ResultStore(run / "jobs")
    with pytest.raises(ValueError, match="saved as pickles"):
        store.load({"seed": 0})
    assert main(["migrate-jobs", str(run)]) == 0
    assert "converted 1 job results" in capsys.readouterr().out
    found, loaded = store.load({"seed": 0})
    assert found and loaded["pair"] == (1, 2) and loaded["summary"] == {"eval_return": 2.0}
    pd.testing.assert_frame_equal(loaded["curve"], frame)
    assert (run / "jobs" / "pickled" / "seed-0-x.pkl").is_file() and not store.pickled()
    assert main(["migrate-jobs", str(run)]) == 0 and "nothing to convert" in capsys.readouterr().out


def test_a_job_result_that_is_not_data_is_refused_when_saved(tmp_path):
    with pytest.raises(TypeError, match=r"the result of job \{'seed': 0\}\['model'\] is a builtins.object"):
        ResultStore(tmp_path).save({"seed": 0}, {"model": object()})
    assert not list(tmp_path.iterdir())


def test_the_resume_cli_and_reuse_also_refuse_pickles_through_run_cli(tiny_notebooks, tmp_path):
    params = {"x": 2, "scale": 0.5, "label": "a", "flag": False, "sizes": [1, 2], "fail": True}
    run = _run_folder_with_jobs(tmp_path, "tiny", params)
    marker = tmp_path / "code_ran"
    (run / "jobs" / "a.pkl").write_bytes(pickle.dumps(_RunsCode(marker)))
    result = run_cli("run", "--resume", str(run))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "saved as pickles (a.pkl)" in result.stderr and not marker.exists()
