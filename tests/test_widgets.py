"""The sparsity tuner driven from Python: controls change settings, figures follow, the policy stays intact."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlq.experiments.constraints import ConstraintError, check_value, parse_constraint
from rlq.experiments.run_folders import short_path
from rlq.experiments.tuner_space import SETTING_RANGES
from rlq.faces.tuner_figures import CURRENT, PLOTLY_MIME, explored_traces, training_figure
from rlq.faces.widgets import SparsityTuner, TunerSettings, TunerTraining, compress_policy
from rlq.rl.agents import make_model, train_agent

NET = [16, 16]


@pytest.fixture(scope="module")
def agent():
    from rlq.quant.latency import torch_threads

    hyper = {"n_steps": 64, "batch_size": 64, "policy_kwargs": {"net_arch": NET}}
    with torch_threads(1):  # tiny networks train fastest on one thread, the more so on a shared machine
        return train_agent(make_model("PPO", "CartPole-v1", seed=0, n_envs=2, hyperparams=hyper), 1024).model


def _dense_count() -> int:
    # PPO on CartPole, net_arch [16, 16]: actor 4-16-16-2, critic 4-16-16-1
    return 2 * (4 * 16 + 16 * 16) + 16 * 2 + 16 * 1


def test_compress_policy_counts_by_hand_and_leaves_the_original(agent):
    before = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    out = compress_policy(agent.policy, TunerSettings(method="gst", block_size=4, sparsity=0.5))
    # only the two hidden 16x16 layers are compressed: 256 / 4 vectors entries, half of them kept
    stored = _dense_count() - 2 * 256 + 2 * (256 // 4 // 2)
    assert out["compression_ratio"] == pytest.approx(1 - stored / _dense_count())
    assert sum(r["stored"] for r in out["layers"]) == stored
    after = agent.policy.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    bc = compress_policy(agent.policy, TunerSettings(method="block_circulant", block_size=2))
    assert bc["compression_ratio"] == pytest.approx(2 * 128 / _dense_count())
    # fp32 block-circulant stores no index: 32 bits for each stored value
    assert bc["bits_per_weight"] == pytest.approx(32 * (_dense_count() - 2 * 128) / _dense_count())
    everything = compress_policy(
        agent.policy, TunerSettings(method="pruning", sparsity=0.5, skip_first_last=False)
    )
    kept = sum(round(n * 0.5) for n in (64, 256, 32, 64, 256, 16))
    assert everything["compression_ratio"] == pytest.approx(1 - kept / _dense_count())


def _linear_weights(acting) -> list[torch.Tensor]:
    """Return the weights of every Linear layer of what acts (a quantized action path, or a policy)."""
    network = getattr(acting, "network", acting)
    return [m.weight.detach() for m in network.modules() if isinstance(m, torch.nn.Linear)]


def test_quantized_copy_has_few_weight_values_per_row_and_counts_its_bits(agent):
    out = compress_policy(agent.policy, TunerSettings(method="none", bits=2))
    weights = _linear_weights(out["policy"])
    assert len(weights) == 3  # the action path: two hidden layers and the action head
    # 2-bit symmetric codes -1, 0, 1 times one scale per output row
    assert all(torch.unique(row).numel() <= 3 for weight in weights for row in weight)
    assert any(torch.unique(weight).numel() > 3 for weight in weights)  # rows have their own scales
    # 2-bit codes plus one 32-bit scale per output row of the six layers (16 + 16 + 2 + 16 + 16 + 1 rows)
    assert out["stored_bytes"] == (_dense_count() * 2 + 67 * 32) / 8
    assert out["dense_bytes"] == _dense_count() * 4
    assert out["bits_per_weight"] == pytest.approx(2 + 67 * 32 / _dense_count())  # 16-wide rows: scales cost
    assert compress_policy(agent.policy, TunerSettings(method="none"))["bits_per_weight"] == 32
    half = compress_policy(agent.policy, TunerSettings(method="none", bits=16))
    assert half["bits_per_weight"] == 16 and all(
        w.dtype == torch.float16 for w in _linear_weights(half["policy"])
    )


def _control_values(control) -> list:
    """Return every value a person can give ``control``: a dropdown's options, a slider's steps, a box's two."""
    if hasattr(control, "options"):
        return list(control.options)
    if isinstance(control.value, bool):
        return [False, True]
    steps = round((control.max - control.min) / control.step)
    return [round(control.min + k * control.step, 10) for k in range(steps + 1)]


def test_every_value_of_every_control_evaluates_with_every_method_and_precision(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, seed=0, auto=False)
    values = {name: _control_values(control) for name, control in tuner.controls.items()}
    assert values["bits"] == [32, 16, 8, 6, 4, 3, 2] and len(values["sparsity"]) == 20
    assert values["sparsity"][-1] == SETTING_RANGES["sparsity"].max
    tried = [TunerSettings(method=m, bits=b) for m in values["method"] for b in values["bits"]]
    base = TunerSettings(method="gst", bits=4)
    tried += [
        replace(base, **{name: v}) for name, options in values.items() if name != "method" for v in options
    ]
    for settings in tried:
        point = tuner.evaluate(settings)
        assert point["settings"] == settings.evaluated() and math.isfinite(point["mean_return"]), settings
        assert tuner.current is not None and tuner.points[tuner.current] is point
    assert len(tuner.points) == len({s.evaluated() for s in tried})
    fp16 = {p["method"]: p["bits_per_weight"] for p in tuner.points if p["bits"] == 16}
    assert fp16["none"] == 16 and max(fp16.values()) == 16 and len(fp16) == 4  # a point for every method


def _star(fig) -> list:
    (star,) = [trace for trace in fig.data if trace.name == CURRENT]
    return list(star.y)


def test_evaluating_adds_a_point_and_redraws_every_figure(agent):
    tuner = SparsityTuner(
        agent, "CartPole-v1", n_episodes=2, seed=0, settings=TunerSettings(method="pruning")
    )
    first = tuner.evaluate()
    second = tuner.evaluate(TunerSettings(method="none", bits=4))
    reward = tuner.figures["reward"]
    explored = explored_traces(reward)
    assert [list(t.x) for t in explored] == [[first["bits_per_weight"]], [second["bits_per_weight"]]]
    assert second["bits_per_weight"] < 8 < first["bits_per_weight"]
    # the method is the colour, the precision the symbol, and the legend says both once
    assert [t.name for t in explored] == ["pruning, 32 bit", "none, 4 bit"]
    assert len({t.marker.color for t in explored}) == len({t.marker.symbol for t in explored}) == 2
    # the star is the point the status line names
    assert (
        _star(reward) == [second["mean_return"]]
        and f"return {second['mean_return']:.1f}" in tuner.status_text
    )
    assert reward.layout.xaxis.type == "log" and "32 dense" in reward.layout.xaxis.ticktext
    size = tuner.figures["size"].layout.yaxis
    assert size.type == "log" and list(size.ticktext) == [f"{t:g}" for t in size.tickvals]
    assert {f"{t / 10 ** math.floor(math.log10(t)):.3g}" for t in size.tickvals} <= {
        "1",
        "2",
        "5",
    }  # 1-2-5 only
    assert 10 ** size.range[0] <= min(size.tickvals) and max(size.tickvals) <= 10 ** size.range[1]
    assert "mlp_extractor.policy_net.2" in tuner.figures["layers"].data[0].x
    # what JupyterLab shows and restores on a reload: the same figure as the Output's plain-JSON output
    (shown,) = tuner.views["reward"].output.outputs
    assert [t["y"] for t in shown["data"][PLOTLY_MIME]["data"]] == [
        [first["mean_return"]], [second["mean_return"]], [second["mean_return"]]
    ]  # fmt: skip
    json.dumps(shown)
    table = tuner.explored()
    assert len(table) == 2 and "settings" not in table
    # the dense point (method none) lists no sparsity, block size or skipped layers: it ignores them
    assert (
        table.loc[0, "sparsity"] == 0.5
        and table.loc[1, ["sparsity", "block_size", "skip_first_last"]].isna().all()
    )
    assert table.loc[1, "bits"] == 4 and pd.isna(table.loc[0, "block_size"])  # pruning has no blocks


def test_after_a_sweep_the_controls_show_the_setting_the_star_marks(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, seed=0, settings=TunerSettings(method="gst"))
    swept = [TunerSettings(method="pruning", sparsity=s, bits=8) for s in (0.5, 0.8, 0.95)]
    tuner.sweep(swept)
    assert tuner.settings() == swept[-1] and tuner.controls["sparsity"].value == 0.95
    assert tuner.points[tuner.current]["settings"] == tuner.settings().evaluated()
    assert tuner._worker is None and len(tuner.points) == 3  # moving the controls evaluated nothing more
    tuner.evaluate(swept[0])  # explored before: the star and the controls go back to it together
    assert tuner.current == 0 and tuner.settings() == swept[0]
    tuner.controls["sparsity"].value = 0.6  # a person's move still evaluates
    assert tuner.wait()["sparsity"] == 0.6 and tuner.current == 3


def test_a_setting_the_method_ignores_adds_no_point(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, seed=0, settings=TunerSettings(method="none"))
    tuner.start()
    tuner.wait()
    for name, value in (("sparsity", 0.9), ("s_shift", 0.25), ("block_size", 8), ("skip_first_last", False)):
        tuner.controls[name].value = value  # none ignores all four
        tuner.wait()
    assert len(tuner.points) == 1 and "explored before" in tuner.status_text
    tuner.controls["method"].value = "pruning"  # now the sparsity counts; the block size still does not
    tuner.wait()
    tuner.controls["block_size"].value = 2
    tuner.wait()
    assert len(tuner.points) == 2 and tuner.current == 1
    tuner.evaluate(TunerSettings(method="pruning", sparsity=0.0))  # prunes nothing: the dense point
    assert len(tuner.points) == 2 and tuner.current == 0
    assert _star(tuner.figures["reward"]) == [tuner.points[0]["mean_return"]]
    # nothing runs: the busy bar is empty and cancel is off
    assert (
        tuner.progress.value == 0 and tuner.cancel_button.disabled and tuner.cancel_button.button_style == ""
    )


def test_a_long_evaluation_runs_in_the_background_and_can_be_cancelled(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=200, seed=0)
    tuner.controls["sparsity"].value = 0.3  # returns at once: the evaluation runs in a worker thread
    assert tuner._worker.is_alive() and not tuner.cancel_button.disabled
    tuner.cancel()
    assert not tuner._worker.is_alive() and tuner.points == [] and tuner.status_text == "cancelled"
    assert tuner.progress.value == 0 and tuner.cancel_button.disabled


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "prune"}, "method must be one of"),
        ({"sparsity": 1.0}, "sparsity"),
        ({"bits": 1}, "bits"),
        ({"bits": 5}, "bits"),
        ({"block_size": 1}, "block_size"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TunerSettings(**kwargs)


def test_controls_and_notebook_constraints_take_the_one_declaration(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, auto=False)
    assert tuner.controls["bits"].options == SETTING_RANGES["bits"].choices
    assert tuner.controls["block_size"].options == SETTING_RANGES["block_size"].choices
    assert tuner.controls["sparsity"].max == SETTING_RANGES["sparsity"].max
    block = parse_constraint("initial block size [kind: tuner.block_size]", "here")
    check_value("block_size", 8, 4, block)
    with pytest.raises(ConstraintError, match="block_size.*one of 2, 4, 8"):
        check_value("block_size", 1, 4, block)  # what `rlq run -p block_size 1` is refused with
    sweep = parse_constraint("sparsities swept [kind: tuner.sparsity]", "here")
    with pytest.raises(ConstraintError, match=r"sweep\[1\]"):
        check_value("sweep", [0.5, 0.99], [0.5], sweep)
    with pytest.raises(ConstraintError, match="cannot read"):
        parse_constraint("[kind: tuner.nothing]", "here")


def test_a_slider_drag_evaluates_only_where_it_is_let_go(agent):
    tuner = SparsityTuner(agent, "CartPole-v1", n_episodes=1, auto=False)
    sliders = [c for c in tuner.controls.values() if hasattr(c, "continuous_update")]
    assert sliders and all(c.continuous_update is False for c in sliders)


def test_the_learning_curve_names_every_line_before_training():
    import plotly.io as pio

    fig = training_figure(None, [], [], "")
    assert fig.layout.showlegend is True
    # plotly.js lists a trace in the legend only when it has a point: each line holds one (empty) point
    for trace in pio.from_json(fig.to_json()).data:
        assert len(trace.x) == 1 and trace.x[0] is None and trace.name


def test_train_with_these_settings_writes_a_normal_run_folder_and_draws_its_curve(agent, tmp_path):
    import pandas as pd

    reference = pd.DataFrame({"timestep": [100, 200], "episode_return": [10.0, 20.0]})
    tuner = SparsityTuner(
        agent,
        "CartPole-v1",
        n_episodes=1,
        seed=0,
        training=TunerTraining(steps=512, runs_dir=tmp_path, reference_curve=reference),
    )
    tuner.controls["sparsity"].value = 0.6  # the setting trained; its auto-evaluation ends first, so that
    tuner.wait()  # the status line's last word is the training's (the later of two events writes it)
    tuner.start_training()
    folder = tuner.wait_training()
    assert folder.parent == tmp_path / "sparsity_tuner_train"
    results = json.loads((folder / "results.json").read_text())
    params = json.loads((folder / "params.json").read_text())
    assert results["status"] == "ok" and params["method"] == "gst" and params["sparsity"] == 0.6
    # block-circulant from step 0
    assert params["block_size"] == 4 and results["start_compression_ratio"] > 0.5
    assert (folder / "history.csv").exists() and list((folder / "checkpoints").glob("model_*_steps.zip"))
    this_run, dense, final, compression = tuner.figures["training"].data
    assert this_run.name == "this run, training episodes: GST B=4, s=0.60, S_shift 1.00, fp32"
    assert len(this_run.y) > 0 and max(compression.y) > 0.5
    # the reference is dashed and drawn over this run's line (the two share their seeded warm-up)
    assert (
        dense.name.startswith("dense reference")
        and list(dense.y) == [10.0, 20.0]
        and dense.line.dash == "dash"
    )
    # the final policy's own evaluation is a marker of its own, and the status names both numbers
    assert list(final.y) == [results["eval_return"]] and "evaluated (1 seeded episodes)" in final.name
    assert list(final.x) == [results["timesteps"]] == [512]
    text = tuner.status_text
    assert f"Final policy evaluated on 1 seeded episodes: return {results['eval_return']:.1f}" in text
    assert f"training episodes (the curve): {results['final_train_return']:.1f}" in text
    assert text.endswith(f"Folder: {short_path(folder)}")
    axis = tuner.figures["training"].layout.yaxis2
    assert list(axis.tickvals) == [0, 0.25, 0.5, 0.75, 1] and axis.tickformat == ".0%"
    assert tuner.train_progress.value == tuner.train_progress.max
    assert not tuner.train_button.disabled and tuner.cancel_button.disabled


def test_a_training_of_no_steps_is_refused_when_made():
    for steps in (0, 1.5, True):
        with pytest.raises(ValueError, match="steps must be an int >= 1"):
            TunerTraining(steps=steps)


def test_cancel_stops_a_training_and_the_train_button_waits_for_it(agent, tmp_path):
    tuner = SparsityTuner(
        agent,
        "CartPole-v1",
        n_episodes=1,
        training=TunerTraining(steps=200_000, runs_dir=tmp_path),
        auto=False,
    )
    tuner.start_training()
    assert tuner.train_button.disabled and not tuner.cancel_button.disabled  # at once, from the click
    deadline = time.monotonic() + 120
    while tuner.train_progress.value == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tuner.train_progress.value > 0
    tuner.start_training()  # a second press while it runs starts nothing
    assert "already going" in tuner.status_text
    tuner.cancel_button.click()
    folder = tuner.wait_training(timeout=120)
    assert not tuner._trainer.is_alive() and tuner.trained == [folder]
    results = json.loads((folder / "results.json").read_text())
    assert results["status"] == "cancelled" and 0 < results["timesteps"] < 200_000
    assert list((folder / "checkpoints").glob(f"model_{results['timesteps']}_steps.zip"))
    assert tuner.status_text.startswith(f"training cancelled at step {results['timesteps']:,} of 200,000")
    assert not tuner.train_button.disabled and tuner.cancel_button.disabled
    tuner.controls["bits"].value = 16  # cancelling the training left evaluation alone
    assert tuner.evaluate()["bits"] == 16


def test_a_folder_is_shown_relative_to_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert short_path(tmp_path / "runs" / "a" / "b") == "runs/a/b"
    assert short_path(Path("/")) == "/"  # nothing shorter


def test_a_gst_training_run_is_capped_at_the_compression_the_tuner_evaluated(agent):
    from rlq.compress import GSTConfig, RewardAwareConfig
    from rlq.faces.tuner_training import training_method

    settings = TunerSettings(method="gst", block_size=4, sparsity=0.6)
    method, gst, _ = training_method(settings)
    cap = gst["sparsity"]["max_sparsity"]
    # the tuner keeps 40% of each B-vector (26 of a 16x16 layer's 64 entries, rounded): about 10% of the
    # hidden layers' weights, what the training run caps at
    layers = [r for r in compress_policy(agent.policy, settings)["layers"] if r["kind"] != "dense"]
    evaluated = 1 - sum(r["stored"] for r in layers) / sum(r["dense"] for r in layers)
    assert method == "gst" and cap == pytest.approx(evaluated, abs=1 / 256)
    assert cap == pytest.approx(0.9)
    GSTConfig(
        total_steps=10, **{**gst, "sparsity": RewardAwareConfig(**gst["sparsity"])}
    )  # within the cap rule


@pytest.fixture(scope="module")
def quick_sac():
    """The tuner notebook's quick agent: SAC on Pendulum-v1 at rl-zoo3's settings, 64-64 networks, 3k steps."""
    from rlq.quant.latency import torch_threads
    from rlq.rl.zoo import zoo_hyperparams

    zoo = zoo_hyperparams("SAC", "Pendulum-v1")
    hyper = {**zoo.hyperparams, "policy_kwargs": {"net_arch": [64, 64]}}
    with torch_threads(1):
        return train_agent(
            make_model("SAC", "Pendulum-v1", seed=0, n_envs=zoo.n_envs, hyperparams=hyper), 3_000
        ).model


def test_at_4_bits_two_sparsities_give_different_weights_and_returns(quick_sac, one_thread):
    from rlq.compress import magnitude_prune_
    from rlq.quant import ptq
    from rlq.sb3.networks import copy_policy, named_layers

    settings = [TunerSettings(method="pruning", sparsity=s, bits=4) for s in (0.5, 0.55, 0.6)]
    weights = [_linear_weights(compress_policy(quick_sac.policy, s)["policy"]) for s in settings]
    for a, b in zip(weights, weights[1:], strict=False):
        assert any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))
    hidden = [w[1] for w in weights]  # the actor's 64x64 layer, the one pruned
    zeros = [float((w == 0).float().mean()) for w in hidden]
    assert zeros[0] < zeros[1] < zeros[2]
    # the cause, on this agent: one scale per layer rounds more than 60% of that layer to zero at 4 bits, so
    # pruning 50% to 60% by magnitude removed only weights the quantizer removed anyway
    per_layer = []
    for s in settings:
        pruned = copy_policy(quick_sac.policy)
        magnitude_prune_(pruned, s.sparsity, layers=list(named_layers(pruned, True)))
        per_layer.append(ptq(pruned, "int4").actor.latent_pi[2].weight)
    assert torch.equal(per_layer[0], per_layer[2]) and float((per_layer[0] == 0).float().mean()) > 0.6
    tuner = SparsityTuner(quick_sac, "Pendulum-v1", n_episodes=3, seed=0, auto=False)
    returns = [tuner.evaluate(s)["mean_return"] for s in settings]
    assert len(set(returns)) == 3 and len(tuner.points) == 3
