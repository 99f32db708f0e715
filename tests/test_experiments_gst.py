"""rlq.analysis.gst's settings, jobs and tables, the GST figures, and legacy method names in published results."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
import pytest
from plotly.subplots import make_subplots

from conftest import run_notebook_cell
from rlq.analysis.gst import (
    compare_methods,
    compression_figures,
    controller_decisions,
    sweep_numbers,
    sweep_table,
)
from rlq.analysis.shared_figures import TEMPLATE
from rlq.compress import GSTConfig
from rlq.experiments.results import load_committed, load_committed_results, normalize_method_names
from rlq.sb3.gst_settings import arm_settings, compression_settings

KNOBS = dict(
    prune_updates=20,
    sparsity=dict(max_sparsity=0.9, step_size=0.05, tolerance=0.1, backoff=0.0),
    block_schedule=[[0.0, 4], [0.25, 2]],
    bc_end=0.5,
)

LEGACY_SUMMARY = """method,test_accuracy,accuracy_drop_vs_dense,final_compression,avg_compression
dense,98.9,0.0,0.0,0.0
gradual,99.2,-0.3,69.8,44.5
gst,98.3,0.6,69.8,72.3
"""
LEGACY_COMPARISON = """metric,paper GST,ours dense,ours gradual,ours gst
accuracy (%),91.4,98.9,99.2,98.3
"""


@pytest.mark.parametrize(
    "total, learning_starts", [(700, 200), (30_000, 5_000), (1_000_000, 10_000), (1_024, 0), (800, 0)]
)
def test_compression_settings_count_the_pruning_window_over_the_training_updates(total, learning_starts):
    settings = compression_settings(
        total, learning_starts=learning_starts, s_shift=0.25, transition_method="exact", **KNOBS
    )
    pruning, gst = settings["pruning"], settings["gst"]
    # the rule the notebooks wrote by hand before: 60% of the updates after learning_starts, in prune_updates steps
    assert pruning["update_every"] == max(1, int(0.6 * (total - learning_starts)) // 20)
    assert (pruning["start_fraction"], pruning["end_fraction"], pruning["final_sparsity"]) == (0.2, 0.8, 0.9)
    assert gst["prune_every"] == max(1, total // 20)
    assert gst["block_schedule"] == [(0.0, 4), (0.25, 2)]
    assert gst["s_shift"] == 0.25 and gst["transition_method"] == "exact"
    assert gst["sparsity"] == {"max_sparsity": 0.9, "step_size": 0.05, "tolerance": 0.1, "backoff": 0.0}
    assert gst["sparsity"] is not KNOBS["sparsity"]  # a copy: a notebook's later change to it stays its own


def test_ablation_arms_are_the_earlier_settings_with_one_fix_each():
    gst = compression_settings(30_000, learning_starts=5_000, **KNOBS)["gst"] | {
        "sparsity": {"backoff": 0.05}
    }
    none = arm_settings("gst_none", gst)
    assert (none["target"], none["bc_init"], none["optimizer_reset"]) == ("stored", "projection", "all")
    assert none["sparsity"] == {"backoff": 0.0, "rule": "windowed"}
    fixed = {
        name: arm_settings(f"gst_only_{name}", gst) for name in ("cap", "controller", "optimizer", "init")
    }
    assert fixed["cap"]["target"] == "compression" and fixed["init"]["bc_init"] == "scaled"
    assert fixed["optimizer"]["optimizer_reset"] == "changed"
    assert fixed["controller"]["sparsity"] == {"backoff": 0.05, "rule": "episodes"}
    for name, arm in fixed.items():  # every other setting stays the earlier one
        differs = {k for k in ("target", "bc_init", "optimizer_reset") if arm[k] != none[k]}
        assert len(differs) == (0 if name == "controller" else 1), name
    GSTConfig(total_steps=30_000, **{k: v for k, v in none.items() if k != "sparsity"})  # valid settings
    with pytest.raises(ValueError, match="ablation arm"):
        arm_settings("gst_only_luck", gst)


def test_compression_settings_leave_out_what_a_sweep_sets_per_run_and_reject_a_warmup_past_the_end():
    gst = compression_settings(1_536, **KNOBS)["gst"]
    assert "s_shift" not in gst and "transition_method" not in gst
    with pytest.raises(ValueError, match="learning_starts"):
        compression_settings(100, learning_starts=100, **KNOBS)
    for sparsity, refused in [
        ({"step_size": 0.05}, "max_sparsity"),
        ({"max_sparsity": 0.9, "step": 0.05}, "step"),
    ]:
        with pytest.raises(ValueError, match=refused):
            compression_settings(1_536, **{**KNOBS, "sparsity": sparsity})


def summary_of(rows):
    columns = [
        "seed",
        "method",
        "avg_compression_ratio",
        "final_compression_ratio",
        "covered_fraction",
        "eval_return",
        "final_train_return",
        "start_compression_ratio",
    ]
    return pd.DataFrame(rows, columns=columns)


def test_compare_methods_averages_seeds_and_judges_gst_against_dense():
    summary = summary_of(
        [
            (0, "dense", 0.0, 0.0, 0.9, 100.0, 90.0, 0.0),
            (0, "pruning", 0.5, 0.9, 0.9, 95.0, 90.0, 0.0),
            (0, "gst", 0.7, 0.9, 0.9, 80.0, 90.0, 0.75),
            (1, "dense", 0.0, 0.0, 0.9, 100.0, 90.0, 0.0),
            (1, "pruning", 0.6, 0.9, 0.9, 105.0, 90.0, 0.0),
            (1, "gst", 0.8, 0.9, 0.9, 80.0, 90.0, 0.75),
        ]
    )
    numbers = compare_methods(summary)
    assert numbers["avg_compression_gst"] == pytest.approx(0.75)
    assert numbers["avg_compression_pruning"] == pytest.approx(0.55)
    assert numbers["gap_gst_minus_pruning_pp"] == pytest.approx(20.0)
    assert numbers["final_return_pruning"] == pytest.approx(100.0)
    assert numbers["reward_change_gst_vs_dense_pct"] == pytest.approx(-20.0)
    # one rule answers "no reward drop": the interval of seed_estimates, judged by rlq.claims
    assert "reward_drop_beyond_seed_noise_pct" not in numbers and "seed_std_pct_of_dense" not in numbers
    only_gst = compare_methods(summary[summary["method"] == "gst"], score_name="final_score")
    assert only_gst["avg_compression_pruning"] is None and only_gst["gap_gst_minus_pruning_pp"] is None
    assert only_gst["final_score_dense"] is None and only_gst["reward_change_gst_vs_dense_pct"] is None


def test_controller_decisions_count_pruning_updates_of_gst_runs_only():
    history = pd.DataFrame(
        {
            "method": ["gst", "gst", "gst", "gst", "pruning"],
            "event": ["start", "prune", "log", "prune", "prune"],
            "decision": [None, "rise", "rise", "backoff", "rise"],
            "step": [0, 10, 15, 20, 10],
            "seed": 0,
            "compression_ratio": [0.75, 0.8, 0.8, 0.78, 0.1],
            "target_sparsity": [0.0, 0.05, 0.05, 0.0, 0.1],
            "mean_reward": [None, 1.0, 1.0, 0.5, 1.0],
        }
    )
    assert controller_decisions(history) == {"rise": 1, "backoff": 1}
    fig = compression_figures.gst_schedule_figure(history, ["seed"])
    assert len(fig.data) == 4
    target = next(trace for trace in fig.data if trace.name == "target sparsity")
    assert list(target.x) == [10, 15, 20]  # from the first pruning update: no target before it, not a 0
    assert list(target.y) == [0.05, 0.05, 0.0]
    (phase,) = fig.layout.shapes  # the block-circulant phase, shaded up to that update
    assert (phase.x0, phase.x1) == (0, 10)


def test_gst_schedule_figure_has_no_target_line_without_a_pruning_update():
    history = pd.DataFrame(
        {"method": "gst", "event": ["block_circulant", "log"], "decision": "none", "step": [0, 50], "seed": 0,
         "compression_ratio": 0.7, "target_sparsity": 0.0, "mean_reward": [None, 1.0]}
    )  # fmt: skip
    fig = compression_figures.gst_schedule_figure(history, ["seed"])
    target = next(trace for trace in fig.data if trace.name == "target sparsity")
    assert len(target.x) == 0
    assert (fig.layout.shapes[0].x0, fig.layout.shapes[0].x1) == (0, 50)


def test_return_figures_draw_negative_returns_as_dots_and_no_bar_from_zero():
    means = pd.DataFrame(
        {"avg_compression_ratio": [0.0, 0.5, 0.8, 0.0, 0.5, 0.8],
         "eval_return": [1500.0, 700.0, 800.0, -150.0, -760.0, -730.0]},
        index=pd.MultiIndex.from_product([["HalfCheetah-v5", "Pendulum-v1"], ["dense", "pruning", "gst"]]),
    )  # fmt: skip
    gap = run_notebook_cell(
        "gst_td3_mujoco",
        "# per task and method: average compression",
        means=means,
        gain_min=25.0,
        gain_max=41.5,
        humanoid_best=None,
        compression_figures=compression_figures,
        make_subplots=make_subplots,
        TEMPLATE=TEMPLATE,
    )["fig"]
    bars = [trace for trace in gap.data if trace.type == "bar"]
    assert bars and all(trace.xaxis == "x" for trace in bars)  # bars only for compression, a ratio from 0
    returns = [trace for trace in gap.data if trace.xaxis == "x2" and trace.mode == "markers"]
    assert sorted(y for trace in returns for y in trace.y) == sorted(means["eval_return"])
    dense = [trace for trace in gap.data if trace.name == "dense return (paper: no drop)"]
    # dense's return spans its own task's methods only (tasks have their own scales)
    assert [(list(t.y), [x.split("<br>")[0] for x in t.x]) for t in dense] == [
        ([1500.0] * 3, ["HalfCheetah-v5"] * 3), ([-150.0] * 3, ["Pendulum-v1"] * 3)
    ]  # fmt: skip
    pendulum = means.loc["Pendulum-v1"]
    score = compression_figures.method_bars_figure(pendulum, score="eval_return", score_title="return")
    (bar,) = [trace for trace in score.data if trace.type == "bar"]
    assert list(bar.y) == list(pendulum["avg_compression_ratio"])
    (dots,) = [trace for trace in score.data if trace.type == "scatter"]
    assert dots.mode == "markers" and list(dots.y) == list(pendulum["eval_return"])


def test_the_replay_cell_puts_rule_labels_side_by_side_and_starts_at_the_first_update():
    replays = pd.DataFrame(
        {"step": [0, 80, 100, 0, 80, 100] * 2, "decision": ["none", "warmup", "rise"] * 4,
         "target": [0.0, 0.0, 0.05, 0.0, 0.8, 0.85] * 2, "seed": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
         "rule": (["earlier rule"] * 3 + ["episodes rule"] * 3) * 2}
    )  # fmt: skip
    cell = run_notebook_cell(
        "gst_td3_mujoco", "# each replayed run's target", replays=replays, px=px, TEMPLATE=TEMPLATE
    )
    fig = cell["_"]
    labels = sorted(fig.layout.annotations, key=lambda a: a.x)
    assert [a.text for a in labels] == ["earlier rule", "episodes rule"]
    assert all(a.textangle in (None, 0) for a in labels) and labels[0].y == labels[1].y
    # horizontal labels centred on their panels, each narrower than half the figure's 700 px: they cannot touch
    assert (labels[1].x - labels[0].x) * 700 > max(len(a.text) for a in labels) * 12
    assert {trace.x[0] for trace in fig.data} == {80}  # no target before the first update


def test_sweep_numbers_name_every_configuration_and_the_best():
    summary = pd.DataFrame(
        {
            "method": ["dense", "gst", "gst"],
            "transition": [None, "exact", "projection"],
            "s_shift": [None, 0.25, 0.25],
            "avg_compression_ratio": [0.0, 0.6, 0.5],
            "final_compression_ratio": [0.0, 0.9, 0.9],
            "eval_return": [30.0, 50.0, 40.0],
            "final_train_return": [20.0, 30.0, 35.0],
        }
    )
    events = pd.DataFrame(
        {
            "kind": ["transition", "transition", "prune"],
            "transition": ["exact", "projection", None],
            "mean_shift": [0.0, 0.4, None],
        }
    )
    numbers = sweep_numbers(sweep_table(summary), summary, events)
    assert numbers["best_config"] == "exact, S_shift 0.25"
    assert numbers["avg_compression"] == {"exact, S_shift 0.25": 0.6, "projection, S_shift 0.25": 0.5}
    assert numbers["dense_eval_return"] == 30.0
    assert numbers["transition_shift"] == {"exact": 0.0, "projection": 0.4}


def test_reward_aware_demo_rises_pauses_and_rises_again():
    fig = compression_figures.reward_aware_demo_figure(
        {"max_sparsity": 0.5, "step_size": 0.05, "tolerance": 0.05, "backoff": 0.0}
    )
    targets = list(fig.data[0].y)
    assert targets[-1] > targets[14] and max(targets) <= 0.9


def test_legacy_method_names_are_read_as_pruning(tmp_path, monkeypatch):
    # results published before the rename keep "gradual" on disk; readers see "pruning"
    (tmp_path / "notebooks").mkdir()
    folder = tmp_path / "data" / "results" / "gst_classification" / "medium"
    folder.mkdir(parents=True)
    (folder / "summary.csv").write_text(LEGACY_SUMMARY)
    (folder / "paper_comparison.csv").write_text(LEGACY_COMPARISON)
    (folder / "results.json").write_text(
        json.dumps(
            {
                "gradual_test_accuracy": 99.2,
                "gst_test_accuracy": 98.3,
                "data_source": "digits, gradually resized",
            }
        )
    )
    monkeypatch.setenv("RLQ_HOME", str(tmp_path))

    summary = load_committed("gst_classification", "medium", "summary")
    assert summary["method"].tolist() == ["dense", "pruning", "gst"]
    assert summary.loc[summary["method"] == "pruning", "avg_compression"].item() == 44.5
    comparison = load_committed("gst_classification", "medium", "paper_comparison")
    assert comparison.columns.tolist() == ["metric", "paper GST", "ours dense", "ours pruning", "ours gst"]
    results = load_committed_results("gst_classification", "medium")
    assert results["pruning_test_accuracy"] == 99.2 and "gradual_test_accuracy" not in results
    assert results["data_source"] == "digits, gradually resized"  # only whole names are replaced
    assert load_committed_results("gst_classification", "paper") is None


def test_normalize_method_names_maps_every_legacy_name_in_params_and_leaves_today_s_alone():
    params = {
        "methods": ["dense", "gradual", "gst"],
        "gradual_final_sparsity": 0.7,
        "method": "magnitude_pruning",
    }
    assert normalize_method_names(params) == {
        "methods": ["dense", "pruning", "gst"],
        "pruning_final_sparsity": 0.7,
        "method": "pruning",
    }
    today = pd.DataFrame({"method": ["dense", "pruning", "gst"], "ours pruning": [1, 2, 3]})
    pd.testing.assert_frame_equal(normalize_method_names(today), today)
    with pytest.raises(TypeError):
        normalize_method_names([1, 2])


def test_evaluation_samples_its_actions_when_asked():
    """deterministic=False reaches the policy, which then samples its actions; the same seed samples alike."""
    from rlq.rl.agents import make_model
    from rlq.rl.evaluate import evaluate

    model = make_model(
        "PPO", "CartPole-v1", seed=0, hyperparams={"n_steps": 32, "batch_size": 32, "n_epochs": 1}
    )

    def eval_return(deterministic: bool) -> float:
        return evaluate(model, "CartPole-v1", n_episodes=5, seed=10_000, deterministic=deterministic).mean

    deterministic, stochastic = eval_return(True), eval_return(False)
    # an untrained policy: its argmax action topples the pole in about 9 steps; sampling lasts longer
    assert deterministic != stochastic
    assert eval_return(False) == stochastic  # the same seed gives the same stochastic episodes


def test_seed_estimates_pair_seeds_and_measure_the_drop_against_dense():
    from rlq.analysis.gst import seed_estimates

    summary = pd.DataFrame(
        {
            "method": ["dense", "pruning", "gst"] * 3,
            "seed": [0, 0, 0, 1, 1, 1, 2, 2, 2],
            "avg_compression_ratio": [0.0, 0.4, 0.7, 0.0, 0.5, 0.8, 0.0, 0.45, 0.75],
            "eval_return": [100.0, 90.0, 95.0, 110.0, 100.0, 80.0, 90.0, 95.0, 85.0],
        }
    )
    got = seed_estimates(summary, reps=200)
    # with 3 runs the IQM trims nothing: plain means, computed by hand
    assert got["avg_compression_gst_pct"]["value"] == pytest.approx(75.0)
    assert got["gap_gst_minus_pruning_pp"]["value"] == pytest.approx(30.0)  # 30 %p on every seed
    assert got["gap_gst_minus_pruning_pp"]["lower"] == pytest.approx(30.0)
    dense, gst = 100.0, (95 + 80 + 85) / 3
    assert got["reward_drop_gst_vs_dense_pct"]["value"] == pytest.approx(100 * (dense - gst) / dense)
    drop = got["reward_drop_gst_vs_dense_pct"]
    assert drop["lower"] <= drop["value"] <= drop["upper"] and drop["n"] == 3
    assert got["score_iqm_pruning"]["value"] == pytest.approx(95.0)
    # a method not run leaves its numbers out
    assert "gap_gst_minus_pruning_pp" not in seed_estimates(summary[summary["method"] != "pruning"], reps=50)


def earlier_gst_config(**overrides) -> GSTConfig:
    """The GST settings the committed earlier HalfCheetah runs trained with (their params.json), as a config."""
    from rlq.compress import RewardAwareConfig
    from rlq.core.jsonio import read_json
    from rlq.experiments.results import committed_dir

    p = read_json(committed_dir("gst_td3_mujoco", "earlier_gst") / "params.json")
    sparsity = dict(max_sparsity=p["max_sparsity"], step_size=p["sparsity_step"], tolerance=p["reward_tolerance"],
                    backoff=p["sparsity_backoff"])  # fmt: skip
    gst = compression_settings(
        p["total_timesteps"], learning_starts=p["learning_starts"], prune_updates=p["prune_updates"],
        block_schedule=p["block_schedule"], bc_end=p["bc_end"], s_shift=p["s_shift"], sparsity=sparsity,
    )["gst"]  # fmt: skip
    gst = {**arm_settings("gst_none", gst), **overrides}
    sparsity = RewardAwareConfig(**gst.pop("sparsity"))
    return GSTConfig(
        total_steps=p["total_timesteps"], start_step=p["learning_starts"], sparsity=sparsity, **gst
    )


def test_replaying_the_earlier_runs_episodes_reproduces_their_logged_decisions_and_the_new_rule_backs_off():
    from rlq.compress.gst import replay_decisions

    curve = load_committed("gst_td3_mujoco", "earlier_gst", "curve")
    logged = load_committed("gst_td3_mujoco", "earlier_gst", "history")
    earlier, new = (
        earlier_gst_config(),
        earlier_gst_config(target="compression", sparsity={"backoff": 0.05, "min_episodes": 2}),
    )
    backoffs = 0
    for seed, episodes in curve.groupby("seed"):
        stream = list(episodes[["timestep", "episode_return", "episode_length"]].itertuples(index=False))
        replay = pd.DataFrame(replay_decisions(earlier, stream)).set_index("step")
        updates = logged[(logged["seed"] == seed) & (logged["step"] >= earlier.step_of(0.125))]
        updates = updates[updates["event"] != "end"].drop_duplicates("step", keep="last").set_index("step")
        assert len(updates) == 74 and list(replay.index[1:]) == list(updates.index)
        assert replay.loc[updates.index, "decision"].tolist() == updates["decision"].tolist()
        assert replay.loc[updates.index, "target"].tolist() == pytest.approx(
            updates["target_sparsity"].tolist()
        )
        assert set(updates["decision"]) == {"warmup", "rise", "at_max"}  # it only ever rose
        decisions = [row["decision"] for row in replay_decisions(new, stream)]
        assert "warmup" not in decisions and decisions.count("rise") <= 5
        backoffs += decisions.count("backoff")
    assert backoffs >= 1  # seed 0's dip after the cap (14k-17k steps) is seen


def test_method_bars_color_a_gst_variant_distinctly():
    import pandas as pd

    from rlq.analysis.gst.compression_figures import METHOD_COLORS, method_bars_figure, method_color

    means = pd.DataFrame({"avg_compression_ratio": [0.0, 0.8, 0.5], "score": [10.0, 9.0, 8.0]},
                         index=["dense", "gst", "gst_bc_only"])  # fmt: skip
    fig = method_bars_figure(means, score="score", score_title="score")
    colors = list(fig.data[0].marker.color)
    assert colors[:2] == [METHOD_COLORS["dense"], METHOD_COLORS["gst"]]
    assert colors[2] == method_color("gst_bc_only") and colors[2] not in METHOD_COLORS.values()
