"""Every committed notebook follows rlq's conventions and runs through `rlq run` at its quick preset."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import papermill as pm
import pytest

from conftest import run_cli
from rlq.analysis.pareto import BEST_NUMBERS
from rlq.experiments.registry import REQUIRED_PRESETS, get_experiment, list_experiments

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]

#: notebook -> the numeric headline keys its last cell records with rlq.record(...), each finite at quick. A
#: dict value counts when it is non-empty and every number in it (nested) is finite. Left out: strings and
#: lists (labels, sources, bit lists), decision counts, and keys named below that are None at quick.
HEADLINE_KEYS: dict[str, list[str]] = {
    # dense is always within its own interval, so a best method (fewest bits within dense's interval) exists
    "combo_sparse_quant": [
        *BEST_NUMBERS,
        "paper_gst_avg_compression_pct",
        "paper_quarl_int8_drop_pct",
        "timesteps",
        "seeds",
    ],
    # quick's agent is far from solved; the Cortex-M4 keys are recorded only where make export-tools ran
    "deploy_policy": [
        "torch_return",
        "c_fp32_return",
        "c_int8_return",
        "onnx_int8_return",
        "max_action_diff_c_fp32",
        "max_action_diff_c_int8",
        "max_action_diff_c_int8_same_codes",
        "max_action_diff_onnx_int8",
        "c_int8_weight_bytes",
        "c_fp32_weight_bytes",
        "onnx_int8_bytes",
        "dense_fp32_bytes",
        "c_int8_vs_ort_int8_latency",
        "timesteps",
    ],
    # one seed at quick: each interval is its one run's return, and the return change is defined
    "gst_block_deploy": [
        "per_method",
        "return_change_block_vs_gst_pct",
        "max_compiled_vs_dense_int8",
        "max_compiled_vs_torch",
        "timesteps",
        "seeds",
    ],
    "baseline_rl": [
        "final_mean_return",
        "final_std_return",
        "random_mean_return",
        "train_wall_time_s",
        "timesteps",
        "episodes",
    ],
    # quick runs dense and GST only (no pruning, so avg_compression_pruning is None) with eval_episodes 0, so
    # the score is the training return, and no Breakout episode ends in 800 steps: final_score_dense/_gst and
    # the reward comparisons built on them are None
    "gst_a2c_atari": [
        "avg_compression_gst",
        "avg_compression_dense",
        "paper_avg_compression",
        "covered_fraction",
        "gst_start_compression",
        "timesteps",
        "frames",
    ],
    "gst_classification": [
        "dense_test_accuracy",
        "pruning_test_accuracy",
        "gst_test_accuracy",
        "pruning_final_compression",
        "gst_final_compression",
        "pruning_avg_compression",
        "gst_avg_compression",
        "pruning_accuracy_drop_vs_dense",
        "gst_accuracy_drop_vs_dense",
        "gst_wall_time_s",
        "epochs",
        "steps",
    ],
    # quick's policies score no goal in their one evaluation game, so the dense score is 0 and the reward
    # comparisons (a % of the dense score) are None
    "gst_ppo_football": [
        "avg_compression_dense",
        "avg_compression_pruning",
        "avg_compression_gst",
        "gap_gst_minus_pruning_pp",
        "final_score_dense",
        "final_score_pruning",
        "final_score_gst",
        "covered_fraction",
        "paper_avg_compression",
        "timesteps",
        "seeds",
    ],
    "gst_sweep": [
        "avg_compression",
        "eval_return",
        "dense_eval_return",
        "best_avg_compression",
        "transition_shift",
        "timesteps",
        "seeds",
    ],
    # one seed at quick: the reward comparison is defined (Pendulum's dense return is not 0)
    "gst_td3_mujoco": [
        "avg_compression_dense",
        "avg_compression_pruning",
        "avg_compression_gst",
        "gap_gst_minus_pruning_pp",
        "final_return_dense",
        "final_return_pruning",
        "final_return_gst",
        "reward_change_gst_vs_dense_pct",
        "covered_fraction",
        "per_env",
        "gst_start_compression",
        "paper_gap_min_pp",
        "paper_gap_max_pp",
        "timesteps",
        "seeds",
    ],
    # 200 learner steps reach no return threshold: time_to_threshold_s holds None and the speedups built on it
    # (speedup_int8_vs_fp32, speedup_fp16_vs_fp32) are None
    "quarl_actorq": [
        "compiled_vs_torch_int8_max_action_difference",
        "actor_steps_per_s",
        "bytes_per_broadcast",
        "actor_breakdown_shares",
        "final_return",
        "learner_steps",
    ],
    "quarl_latency": [
        "torch_int8_speedup_batch1",
        "onnx_int8_speedup_batch1",
        "onnx_fp32_speedup_batch1",
        "int8_size_fraction",
        "threads",
    ],
    # lowest_bits_within_tolerance is 32 when no integer width keeps the reward; at quick 16 bits keep PPO's 500
    "quarl_ptq": [
        "int8_relative_change",
        "int8_weights_only_relative_change",
        "fp16_relative_change",
        "lowest_bits_within_tolerance",
        "fp32_return",
        "int8_return",
        "worst_int8_relative_change",
        "tolerance",
        "n_runs",
        "n_agents",
        "n_solved",
    ],
    "quarl_qat": [
        "qat_return",
        "ptq_return",
        "fp32_return",
        "mean_qat_minus_ptq",
        "delay_fraction",
    ],
    "sparsity_tuner": [
        "dense_return",
        "best_compression_within_5pct",
        "best_bits_per_weight_within_5pct",
        "return_spread",
        "points_explored",
    ],
}


def test_there_are_notebooks():
    assert "baseline_rl" in NAMES


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_committed_notebook_has_no_outputs_and_a_kernelspec(path):
    nb = json.loads(path.read_text())
    dirty = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; strip them (nbstripout) before committing"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["metadata"]["kernelspec"]["language"] == "python"


def test_experiment_conventions():
    for exp in list_experiments():
        assert exp.description, f"{exp.name}: first markdown line must describe the experiment"
        for preset in REQUIRED_PRESETS:
            assert preset in exp.presets, f"{exp.name}: missing preset {preset!r}"
        assert set(exp.wall_times) == set(exp.presets), f"{exp.name}: every preset needs a wall time"
        for p in exp.parameters.values():
            assert p.comment, f"{exp.name}: parameter {p.name} needs a comment saying what it is"
        # papermill's own parser must see the same parameters (it warns about any line it cannot read)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            seen = pm.inspect_notebook(str(exp.path))
        assert list(seen) == list(exp.parameters), f"{exp.name}: papermill reads {list(seen)}"
        nb = json.loads(exp.path.read_text())
        assert nb["cells"][1]["metadata"].get("tags") == ["parameters"], (
            f"{exp.name}: parameters must be cell 2"
        )


#: parameters that change how a run runs (and what it shows), never its result: they go under "# How it runs"
PLUMBING = {"checkpoint_every", "torch_threads", "workers", "executor", "ray_address", "show_committed"}
#: what else may stand there: where a run computes, and (gst_td3_mujoco) a window that only its history records
ALSO_PLUMBING = {"device", "backend", "actor_backend", "learner_device", "reward_window"}


def test_parameters_cells_put_the_plumbing_under_how_it_runs():
    for exp in list_experiments():
        source = "".join(json.loads(exp.path.read_text())["cells"][1]["source"])
        assert "\n# How it runs" in source, f"{exp.name}: its parameters cell needs a '# How it runs' line"
        science, plumbing = source.split("\n# How it runs", 1)
        misplaced = sorted(
            name for name in PLUMBING if f"\n{name} = " in science or science.startswith(f"{name} = ")
        )
        assert not misplaced, f"{exp.name}: {misplaced} belong under '# How it runs'"
        others = [line.split(" = ")[0] for line in plumbing.splitlines()[1:]]
        assert set(others) <= PLUMBING | ALSO_PLUMBING, f"{exp.name}: {others} under '# How it runs'"


def test_every_notebook_declares_its_headline_keys():
    missing, stale = sorted(set(NAMES) - set(HEADLINE_KEYS)), sorted(set(HEADLINE_KEYS) - set(NAMES))
    assert not missing and not stale, (
        f"HEADLINE_KEYS must list each notebook's numeric headline keys: missing {missing}, stale {stale}"
    )


def run_failure(name: str, result, out: Path) -> str:
    """Return why ``rlq run`` failed: the run folder's recorded error, else the tail of stderr."""
    message = f"rlq run {name} --preset quick exited {result.returncode}"
    for path in sorted(out.glob(f"{name}/*/results.json"), reverse=True):
        error = json.loads(path.read_text()).get("error")
        if error:
            return f"{message}; {path.parent}/results.json says:\n{error}"
    return f"{message}; stderr:\n{result.stderr[-3000:]}"


def not_finite(value) -> bool:
    """Return whether ``value`` (a number, or a dict of them, nested) is missing a finite number anywhere."""
    if isinstance(value, dict):
        return not value or any(not_finite(v) for v in value.values())
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def check_gst_td3_mujoco(run_dir: Path, results: dict) -> None:
    """Every training writes TensorBoard events into its run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "runs" / "Pendulum-v1__gst__0" / "sb3")).Reload().Tags()
    wanted = {"rollout/ep_rew_mean", "train/actor_loss", "time/fps", "compression/ratio",
              "compression/target_sparsity", "gst/block_size"}  # fmt: skip
    assert wanted <= set(events["scalars"]), events["scalars"]
    assert "gst/decision/text_summary" in events["tensors"]


def check_deploy_policy(run_dir: Path, results: dict) -> None:
    """The exported policies act as PyTorch's, within what each format allows."""
    assert results["c_parity_within_bounds"] is True and results["exported_within_torch_interval"] is True
    assert results["max_action_diff_c_fp32"] < 1e-5 * 2.0  # Pendulum's actions are in [-2, 2]
    assert results["c_int8_weight_bytes"] < results["c_fp32_weight_bytes"] < results["dense_fp32_bytes"]
    for table in ("sizes", "parity", "evaluation", "latency"):
        assert (run_dir / f"{table}.csv").exists(), table
    # each parity row against a stated tolerance; the same int8 codes agree within summation order
    parity_rows = pd.read_csv(run_dir / "parity.csv").set_index(["policy", "reference"])
    same = parity_rows.loc[("C int8", "rlq int8, same codes")]
    assert same["tolerance"] == pytest.approx(1e-4 * 2.0)
    assert same["max |difference|"] <= same["tolerance"] and bool(same["within"])
    assert parity_rows["max |difference|"].notna().all() and parity_rows["tolerance"].notna().all()
    # the C files' stored bytes are their weights plus their DFT tables (2 x 4 x 16 x 16 at B = 16)
    sizes = pd.read_csv(run_dir / "sizes.csv").set_index("policy")
    c_int8 = sizes.loc["C int8: weight data"]
    assert c_int8["bytes"] == results["c_int8_weight_bytes"] == c_int8["weights"] + c_int8["tables"]
    assert c_int8["tables"] == 2 * 4 * 16 * 16


def check_gst_block_deploy(run_dir: Path, results: dict) -> None:
    """The block-pruned actor compiles block-sparse and computes what dense int8 does on the same weights."""
    assert results["exploratory"] is True and set(results["per_method"]) == {"gst", "gst_block"}
    assert results["max_compiled_vs_dense_int8"] <= 1e-5 * 2.0  # Pendulum's actions are in [-2, 2]
    block_rows = [
        row for row in (run_dir / "parity.csv").read_text().splitlines() if row.startswith("gst_block,")
    ]
    assert block_rows and all("sparse_int8 16x4" in row for row in block_rows), block_rows
    for table in ("summary", "parity", "latency", "flash", "targets", "deployed_returns"):
        assert (run_dir / f"{table}.csv").exists(), table
    # each int8 actor played on its run's evaluation episodes, beside the fp32 return train_one measured
    deployed = pd.read_csv(run_dir / "deployed_returns.csv").set_index(["method", "seed"])
    trained = pd.read_csv(run_dir / "summary.csv").set_index(["method", "seed"])
    assert sorted(deployed.index) == sorted(trained.index)
    assert (deployed["PyTorch fp32 return"] == trained.loc[deployed.index, "eval_return"]).all()
    change = (
        100
        * (deployed["compiled int8 return"] - deployed["PyTorch fp32 return"])
        / deployed["PyTorch fp32 return"].abs()
    )
    assert change.to_numpy() == pytest.approx(deployed["compiled int8 change (%)"].to_numpy())
    # the block arm's bits per weight count its block index: fewer bits than an index per kept weight of the
    # same actor, rebuilt from its saved weights with a mask on each layer holding zeros
    from rlq.quant.bits import bits_per_weight

    summary = pd.read_csv(run_dir / "summary.csv").set_index("method")
    # (a kept block may hold a weight that is exactly zero, so this mask keeps a few weights fewer)
    element_index = bits_per_weight(
        _masked_actor(run_dir / "actors" / "gst_block__0.npz"), bits="int8", per_channel=True
    )
    assert summary.loc["gst_block", "actor_bits_per_weight_int8"] < element_index - 0.05


def _masked_actor(path: Path) -> Any:
    """The saved actor's linear layers (``mu.<i>``) in a row, each layer holding zeros pruned by its zeros."""
    import numpy as np
    import torch
    from torch.nn.utils import prune

    with np.load(path) as archive:
        weights = {k: torch.from_numpy(archive[k]) for k in archive.files}
    indices = sorted({int(k.split(".")[1]) for k in weights})
    layers = []
    for i in indices:
        out_features, in_features = weights[f"mu.{i}.weight"].shape
        layer = torch.nn.Linear(in_features, out_features)
        layer.load_state_dict({"weight": weights[f"mu.{i}.weight"], "bias": weights[f"mu.{i}.bias"]})
        if (layer.weight == 0).any():
            prune.custom_from_mask(layer, "weight", layer.weight != 0)
        layers.append(layer)
    return torch.nn.Sequential(*layers)


def check_quarl_actorq(run_dir: Path, results: dict) -> None:
    """Each regime again: fp32 PyTorch actors against int8 ones on the compiled kernels."""
    from rlq.deploy import kernels_available

    runs = pd.read_csv(run_dir / "compiled_regime_runs.csv")
    compiled = "compiled-int8" if kernels_available() else "compiled-numpy-int8"
    assert set(runs.loc[runs["precision"] == "fp32", "engine"]) == {"torch-fp32"}
    assert set(runs.loc[runs["precision"] == "int8", "engine"]) == {compiled}
    assert set(results["compiled_actor_speedup"]) == set(runs["regime"]) == {"learner_bound", "actor_bound"}
    parts = pd.read_csv(run_dir / "compiled_breakdown.csv")
    assert set(parts["part"]) == {"inference", "environment", "communication", "model load"}
    assert (parts["ms_per_step"] >= 0).all() and (
        parts.loc[parts["part"] == "inference", "ms_per_step"] > 0
    ).all()
    agreement = pd.read_csv(run_dir / "compiled_agreement.csv")
    assert len(agreement) == len(runs) // 2 and (agreement["observations"] > 0).all()


def check_baseline_rl(run_dir: Path, results: dict) -> None:
    """PPO on CartPole learns."""
    # PPO on CartPole must clearly learn: far above the random policy on the same evaluation seeds
    assert results["final_mean_return"] > max(150, 5 * results["random_mean_return"])
    assert 10 < results["random_mean_return"] < 50
    assert (run_dir / "curve.csv").exists() and list((run_dir / "checkpoints").glob("model_*_steps.zip"))


NOTEBOOK_CHECKS = {
    "gst_td3_mujoco": check_gst_td3_mujoco,
    "deploy_policy": check_deploy_policy,
    "gst_block_deploy": check_gst_block_deploy,
    "quarl_actorq": check_quarl_actorq,
    "baseline_rl": check_baseline_rl,
}
"""What a notebook's quick run must show beyond its headline keys, by notebook."""


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_at_quick_preset(name, tmp_path):
    assert name in HEADLINE_KEYS, f"{name}: declare its numeric headline keys in HEADLINE_KEYS"
    missing = get_experiment(name).missing()
    if missing and os.environ.get("RLQ_REQUIRE_FOOTBALL") != "1":  # CI sets it after `make football`
        pytest.skip(f"{name} needs {', '.join(f'{m} ({how})' for m, how in missing.items())}")
    result = run_cli("run", name, "--preset", "quick", "--out", str(tmp_path), "--quiet")
    if result.returncode != 0:
        pytest.fail(run_failure(name, result, tmp_path), pytrace=False)
    run_dir = Path(result.stdout.strip().splitlines()[-1])
    results = json.loads((run_dir / "results.json").read_text())
    assert result.returncode == 0 and results["status"] == "ok", results.get("error", result.stderr[-3000:])
    assert (run_dir / "output.ipynb").exists() and (run_dir / "params.json").exists()
    absent = [key for key in HEADLINE_KEYS[name] if key not in results]
    assert not absent, f"{name}: results.json lacks headline keys {absent}; it holds {sorted(results)}"
    bad = {key: results[key] for key in HEADLINE_KEYS[name] if not_finite(results[key])}
    assert not bad, f"{name}: headline numbers not finite at quick: {bad}"
    NOTEBOOK_CHECKS.get(name, lambda run_dir, results: None)(run_dir, results)
