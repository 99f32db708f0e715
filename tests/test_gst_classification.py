"""gst_classification over seeds as its notebook trains them: per-seed folders and resume, seed-stacked tables, the estimates."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

from conftest import run_notebook_cell
from rlq import stats
from rlq.analysis.gst import (
    classification_estimates,
    classification_numbers,
    classification_tables,
    load_classification_data,
    mean_over_seeds,
)
from rlq.analysis.gst.classification import with_seed_column
from rlq.compress import GradualPruning, GradualPruningConfig, GSTConfig, GSTSchedule, RewardAwareConfig
from rlq.rl.parallel import run_jobs
from rlq.vision import SGDRecipe, count_parameters, resnet32, train_classifier

KNOBS = dict(
    gst_block_size=2, gst_late_block_size=0, gst_transition_at=0.25, gst_bc_end=0.5, gst_s_shift=1.0,
    gst_max_sparsity=0.7, gst_step_size=0.05, gst_tolerance=0.01, gst_window=2, pruning_final_sparsity=0.7,
)  # fmt: skip
CELL_MODULES = dict(
    copy=copy, torch=torch, GradualPruning=GradualPruning, GradualPruningConfig=GradualPruningConfig,
    GSTConfig=GSTConfig, GSTSchedule=GSTSchedule, RewardAwareConfig=RewardAwareConfig, run_jobs=run_jobs,
    train_classifier=train_classifier, resnet32=resnet32, count_parameters=count_parameters, SGDRecipe=SGDRecipe,
)  # fmt: skip

LEGACY_SUMMARY = """method,test_accuracy,accuracy_drop_vs_dense,final_compression,avg_compression,wall_time_s
dense,98.9,0.0,0.0,0.0,10.0
gst,98.3,0.6,69.8,72.3,8.0
"""


@pytest.fixture(scope="module")
def data():
    """The quick preset's data (digits at 8x8), cut to 160 training images so two seeds train in seconds."""
    return load_classification_data(
        "", digits_size=8, max_train_images=160, max_test_images=64, val_size=0.1, seed=0
    )


def _schedules(data, methods=("dense", "gst"), epochs=2):
    """The schedules the notebook's own cell builds, for these data and epochs (no seed trained: ``seeds=[]``)."""
    cell = run_notebook_cell(
        "gst_classification", "per_epoch = dict(", **KNOBS, **CELL_MODULES, data=data, batch_size=48, width=4,
        total_steps=epochs * data.steps_per_epoch(48), epochs=epochs, seeds=[], methods=[], workers=1,
        lr=0.05, weight_decay=1e-4, lr_schedule="step",
    )  # fmt: skip
    return {method: cell["schedules"][method] for method in methods}


def seed_folder(out, seed):
    return out / f"seed_{seed}"


def train_one(data, schedule, out, seed, method, threads=None):
    """One seed and method as gst_classification's ``train_one`` trains it: the seed's initial weights, resumable."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)  # the same initial weights for every method of this seed
    model = resnet32(num_classes=data.num_classes, width=4, in_channels=data.image_shape[0])
    return train_classifier(
        model, data, 2, recipe=SGDRecipe(lr=0.05, batch_size=48), schedule=copy.deepcopy(schedule), seed=seed,
        method=method, checkpoint_dir=seed_folder(out, seed) / "checkpoints" / method,
    )  # fmt: skip


def _train(data, out, seeds, methods=("dense", "gst")):
    schedules = _schedules(data, methods)
    return {seed: {m: train_one(data, schedules[m], out, seed, m) for m in methods} for seed in seeds}


def test_each_seed_trains_a_fresh_copy_of_the_schedule_it_is_given(data, tmp_path):
    schedules = _schedules(data, ("gst",))
    before = schedules["gst"].state_dict()
    results = [train_one(data, schedules["gst"], tmp_path, seed, "gst") for seed in (0, 1)]
    assert schedules["gst"].state_dict() == before  # the notebook's schedule never trains
    # both seeds started from the same (fresh) schedule: each compressed from step 0 (B = 2: half of nearly every weight)
    assert all(r.history["compression_ratio"].iloc[0] > 0.45 for r in results)


def test_a_schedule_for_another_length_of_training_is_refused(data, tmp_path):
    with pytest.raises(ValueError, match="the schedule plans"):
        train_one(data, _schedules(data, ("gst",), epochs=3)["gst"], tmp_path, 0, "gst")
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("classification")
    return out, _train(data, out, [0, 1])


def test_every_seed_trains_every_method_in_its_own_folder(trained):
    out, results = trained
    assert list(results) == [0, 1] and all(list(r) == ["dense", "gst"] for r in results.values())
    for seed in (0, 1):
        for method in ("dense", "gst"):
            assert any((seed_folder(out, seed) / "checkpoints" / method).iterdir())
    assert not (out / "checkpoints").exists()
    # each seed its own initial weights and batches: the runs differ
    assert not results[0]["dense"].history.equals(results[1]["dense"].history)


def test_tables_stack_the_seeds_and_pair_the_drop_within_each(trained):
    out, results = trained
    history, summary = classification_tables(results, out)
    assert summary.columns[0] == "seed" and history.columns[0] == "seed"
    assert summary[["seed", "method"]].values.tolist() == [[0, "dense"], [0, "gst"], [1, "dense"], [1, "gst"]]
    assert len(history) == 2 * 2 * 2  # seeds x methods x epochs
    for seed in (0, 1):
        rows = summary[summary["seed"] == seed].set_index("method")
        drop = rows.loc["dense", "test_accuracy"] - rows.loc["gst", "test_accuracy"]
        assert rows.loc["gst", "accuracy_drop_vs_dense"] == pytest.approx(drop)
    assert pd.read_csv(out / "summary.csv")["seed"].tolist() == [0, 0, 1, 1]
    means = mean_over_seeds(summary).set_index("method")
    assert means.loc["gst", "test_accuracy"] == pytest.approx(
        summary.loc[summary["method"] == "gst", "test_accuracy"].mean()
    )


def test_numbers_keep_the_means_and_add_the_estimates_over_seeds(trained, data):
    out, results = trained
    _, summary = classification_tables(results)
    numbers = classification_numbers(summary, data, epochs=2, steps=2 * data.steps_per_epoch(48), width=4)
    gst, dense = (summary[summary["method"] == m].set_index("seed") for m in ("gst", "dense"))
    assert numbers["seeds"] == [0, 1] and numbers["n_seeds"] == 2
    assert numbers["gst_test_accuracy"] == pytest.approx(gst["test_accuracy"].mean())
    assert numbers["gst_final_compression"] == pytest.approx(gst["final_compression"].mean())
    compression = numbers["estimates"]["gst_final_compression_pct"]
    drop = numbers["estimates"]["gst_accuracy_drop_pp"]
    # by hand: the IQM of two runs is their mean, and the bootstrap's 95% interval over 2 runs spans them
    drops = (dense["test_accuracy"] - gst["test_accuracy"]).to_numpy()
    assert drop["value"] == pytest.approx(drops.mean())
    assert (drop["lower"], drop["upper"]) == pytest.approx((drops.min(), drops.max()))
    finals = gst["final_compression"].to_numpy()
    assert compression["value"] == pytest.approx(finals.mean())
    assert (compression["lower"], compression["upper"]) == pytest.approx((finals.min(), finals.max()))
    assert (compression["n"], compression["unit"], drop["n"], drop["unit"]) == (2, "%", 2, "%p")


def test_estimates_pair_seeds_by_hand_on_five_seeds():
    summary = pd.DataFrame(
        {
            "seed": [0, 1, 2, 3, 4] * 2,
            "method": ["dense"] * 5 + ["gst"] * 5,
            "test_accuracy": [90.0, 91.0, 92.0, 93.0, 94.0, 89.0, 91.0, 90.0, 93.5, 90.0],
            "final_compression": [0.0] * 5 + [68.0, 69.0, 70.0, 71.0, 100.0],
        }
    )
    estimates = classification_estimates(summary)
    # paired drops 1, 0, 2, -0.5, 4: IQM trims one of five at each end (scipy's trim_mean at 25%: int(1.25) = 1)
    assert estimates["gst_accuracy_drop_pp"]["value"] == pytest.approx((0 + 1 + 2) / 3)
    assert estimates["gst_final_compression_pct"]["value"] == pytest.approx((69 + 70 + 71) / 3)
    expected = stats.estimate([1.0, 0.0, 2.0, -0.5, 4.0]).as_dict("%p")
    assert estimates["gst_accuracy_drop_pp"] == pytest.approx(expected)
    assert estimates["gst_accuracy_drop_pp"]["n"] == 5
    assert "gst_accuracy_drop_pp" not in classification_estimates(summary[summary["method"] == "gst"])


def test_a_legacy_summary_without_seeds_reads_as_seed_zero(tmp_path, data):
    (tmp_path / "summary.csv").write_text(LEGACY_SUMMARY)
    legacy = pd.read_csv(tmp_path / "summary.csv")
    assert with_seed_column(legacy)["seed"].tolist() == [0, 0]
    numbers = classification_numbers(legacy, data, epochs=40, steps=800, width=16)
    assert numbers["gst_accuracy_drop_vs_dense"] == pytest.approx(0.6)
    assert numbers["gst_final_compression"] == pytest.approx(69.8)
    assert numbers["seeds"] == [0]
    one = numbers["estimates"]["gst_accuracy_drop_pp"]
    assert (one["value"], one["lower"], one["upper"], one["n"]) == pytest.approx((0.6, 0.6, 0.6, 1))


def test_resuming_one_seed_leaves_the_other_untouched(data, tmp_path):
    first = _train(data, tmp_path, [0, 1], methods=("dense",))
    kept = {p: p.stat().st_mtime_ns for p in (seed_folder(tmp_path, 0) / "checkpoints").rglob("*")}
    for checkpoint in (seed_folder(tmp_path, 1) / "checkpoints" / "dense").iterdir():
        checkpoint.unlink()  # seed 1 interrupted before its first epoch ended
    again = _train(data, tmp_path, [0, 1], methods=("dense",))
    assert again[0]["dense"].resumed_from == 2  # seed 0 finished: read back, not retrained
    assert again[1]["dense"].resumed_from is None  # seed 1 trained again from scratch
    assert {p: p.stat().st_mtime_ns for p in (seed_folder(tmp_path, 0) / "checkpoints").rglob("*")} == kept
    pd.testing.assert_frame_equal(again[0]["dense"].history, first[0]["dense"].history)
    pd.testing.assert_frame_equal(
        again[1]["dense"].history.drop(columns="wall_time_s"),
        first[1]["dense"].history.drop(columns="wall_time_s"),
    )


def test_workers_train_the_same_models_as_one_process(trained, data, tmp_path):
    out, alone = trained
    threads = torch.get_num_threads()  # the fixture's thread count, so the sums run in the same order
    schedules = _schedules(data)
    jobs = [dict(data=data, schedule=schedules[m], out=tmp_path, seed=s, method=m, threads=threads)
            for s in (0, 1) for m in ("dense", "gst")]  # fmt: skip
    run_jobs(train_one, jobs, workers=2)
    for job in jobs:
        seed, method = job["seed"], job["method"]
        read_back = train_one(**job)  # trained in a worker, then read back here from its final checkpoint
        assert read_back.resumed_from == 2
        pd.testing.assert_frame_equal(
            read_back.history.drop(columns="wall_time_s"),
            alone[seed][method].history.drop(columns="wall_time_s"),
        )
        mine, theirs = read_back.model.state_dict(), alone[seed][method].model.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
