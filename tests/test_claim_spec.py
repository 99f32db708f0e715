"""The claims specification (data/claims.csv): its rows are well formed, and published runs are held to it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlq.claims.measure import measure, measure_table, recorded_estimate, table_metric
from rlq.claims.spec import claim_specs, read_claims
from rlq.experiments.paper import paper_numbers
from rlq.experiments.paths import data_dir
from rlq.experiments.registry import get_experiment
from rlq.stats import estimate, paired_percent_drop

SPEC = data_dir() / "claims.csv"
RESULTS = data_dir() / "results"


def test_every_claim_names_a_paper_row_and_presets_its_notebook_declares():
    rows = {(r.paper, r.experiment, r.metric) for r in paper_numbers().itertuples()}
    for spec in claim_specs():
        assert (spec.paper, spec.paper_experiment, spec.paper_metric) in rows, spec.key
        presets = get_experiment(spec.experiment).presets
        assert set(spec.presets) <= set(presets), (spec.key, spec.presets)
        assert spec.min_seeds >= 5  # no claim is judged on fewer than 5 seeds
    chaotic = [s for s in claim_specs() if s.id in ("gst_td3_reward", "gst_a2c_reward")]
    assert chaotic and all(s.min_seeds == 10 for s in chaotic)  # TD3's and A2C's returns are chaotic


def test_the_papers_two_claims_that_had_no_row_have_one():
    ids = {s.id for s in claim_specs(current_only=True)}
    assert {"gst_td3_humanoid_compression", "quarl_qat_2bits", "quarl_qat_4bits"} <= ids


def _write(tmp_path: Path, changes: dict[int, dict[str, str]]) -> Path:
    rows = list(csv.DictReader(SPEC.open()))
    for row, change in changes.items():
        rows[row].update(change)
    path = tmp_path / "claims.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize(
    "changes,message",
    [
        ({0: {"estimator": "median_of_luck"}}, "estimator 'median_of_luck' is not one of"),
        ({0: {"threshold": "paper * 2"}}, r"threshold 'paper \* 2' is not"),
        ({0: {"direction": ">"}}, "direction '>' is not >= or <="),
        ({0: {"rows": "env_id"}}, "rows 'env_id' is not key=value"),
        ({0: {"status": "superseded"}, 1: {"status": "superseded"}}, "'gst_td3_gain' has no current version"),
        ({0: {"min_seeds": "many"}}, "line 2 .'gst_td3_gain'.: invalid literal"),
        ({1: {"version": "2"}}, r"holds \['gst_td3_gain@2'\] more than once"),
    ],
)
def test_a_malformed_row_is_refused_naming_its_line_and_field(tmp_path, changes, message):
    assert read_claims(SPEC)  # the committed file reads
    with pytest.raises(ValueError, match=message):
        read_claims(_write(tmp_path, changes))


def _published() -> list[tuple[Path, dict]]:
    return [(p.parent, json.loads(p.read_text())) for p in sorted(RESULTS.glob("*/*/results.json"))]


def _mismatches(folder: Path, results: dict, experiment: str, preset: str) -> tuple[int, list[str]]:
    """Return how many recorded estimates were checked against the spec's computation, and those that differ."""
    checked, wrong = 0, []
    for spec in claim_specs():
        if (
            spec.experiment != experiment
            or preset not in spec.presets
            or spec.estimator in ("joint", "recorded")
        ):
            continue
        recorded, found = recorded_estimate(spec, results), measure(spec, folder, results)
        if recorded is None:
            continue  # recorded before this metric existed: the report computes it from the table
        got = None if found is None else found.estimate
        same = got is not None and np.allclose(
            [got.value, got.lower, got.upper, got.n],
            [recorded.value, recorded.lower, recorded.upper, recorded.n], rtol=1e-9, atol=1e-9,
        )  # fmt: skip
        checked += 1
        if not same:
            wrong.append(f"{spec.key} in {folder}: recorded {recorded}, the spec gives {got}")
    return checked, wrong


def test_every_published_run_records_the_specs_metric_for_the_claims_of_its_preset():
    """A notebook that recorded a claim's estimate with another metric than the spec's fails here."""
    total = 0
    for folder, results in _published():
        checked, wrong = _mismatches(folder, results, folder.parent.name, folder.name)
        assert not wrong, wrong
        total += checked
    assert total >= 12


def test_a_recorded_number_made_another_way_is_caught(tmp_path):
    source = RESULTS / "gst_td3_mujoco" / "medium"
    folder = tmp_path / "medium"
    folder.mkdir()
    (folder / "summary.csv").write_text((source / "summary.csv").read_text())
    results = json.loads((source / "results.json").read_text())
    results["estimates"]["reward_drop_gst_vs_dense_pct"]["upper"] = 9.0  # an interval that would hold
    checked, wrong = _mismatches(folder, results, "gst_td3_mujoco", "medium")
    assert checked >= 2 and len(wrong) == 1 and wrong[0].startswith("gst_td3_reward@1")


def test_the_paired_drop_against_an_independent_computation():
    dense = np.array([6000.0, 5500.0, 6200.0, 4000.0, 5900.0])
    gst = np.array([5800.0, 5400.0, 5000.0, 3900.0, 6100.0])
    got = paired_percent_drop(gst, dense, reps=4000, seed=3)

    def iqm(x):  # the middle half of the sorted values: 5 runs keep the middle 3
        x = np.sort(x)
        k = int(len(x) * 0.25)
        return x[k : len(x) - k].mean()

    assert got.value == pytest.approx(100 * (iqm(dense) - iqm(gst)) / iqm(dense))
    rng = np.random.default_rng(3)
    draws = []
    for idx in rng.integers(0, 5, size=(4000, 5)):
        draws.append(100 * (iqm(dense[idx]) - iqm(gst[idx])) / iqm(dense[idx]))
    assert (got.lower, got.upper) == pytest.approx(tuple(np.percentile(draws, [2.5, 97.5])))
    # a constant drop on every seed pairs exactly: the unpaired interval is wider
    paired = paired_percent_drop(dense * 0.9, dense, reps=2000)
    assert paired.lower == pytest.approx(10.0) and paired.upper == pytest.approx(10.0)


def test_a_fixed_schedule_pairs_with_every_seed_and_a_varying_reference_only_with_its_own():
    table = pd.DataFrame(
        [{"seed": s, "method": "gst", "c": 0.80 + 0.01 * s} for s in range(5)]
        + [{"seed": s, "method": "pruning", "c": 0.54} for s in range(2)]
    )
    fixed = measure_table(table_metric("paired_difference", "c", "gst", "pruning", 100.0), table)
    assert fixed.estimate.n == 5 and fixed.estimate.value == pytest.approx(
        estimate(100 * (0.80 + 0.01 * np.arange(5) - 0.54)).value
    )
    common = measure_table(table_metric("paired_difference_common", "c", "gst", "pruning", 100.0), table)
    assert common.estimate.n == 2
    table.loc[table.method == "pruning", "c"] = [0.54, 0.50]  # no longer a fixed schedule: pairs by seed
    assert (
        measure_table(table_metric("paired_difference", "c", "gst", "pruning", 100.0), table).estimate.n == 2
    )


def _coverage(n: int, datasets: int, paired: bool) -> float:
    """Return how often the 95% interval covers the truth on normal data of ``n`` seeds."""
    rng = np.random.default_rng(n)
    hits = 0
    for i in range(datasets):
        if paired:  # dense ~ N(100, 20), GST 10% below it on the same seed plus its own noise
            dense = rng.normal(100.0, 20.0, n)
            est = paired_percent_drop(0.9 * dense + rng.normal(0.0, 10.0, n), dense, reps=300, seed=i)
            hits += est.lower <= 10.0 <= est.upper
        else:
            est = estimate(rng.normal(0.0, 1.0, n), reps=200, seed=i)
            hits += est.lower <= 0.0 <= est.upper
    return hits / datasets


def test_the_interval_covers_the_truth_as_docs_claims_says():
    """docs/claims.md: about 75% at 3 seeds, about 90% at 5 and 92-93% at 10 (normal data, simulated).

    A few hundred data sets leave about 2 %p of Monte Carlo error: the bounds test the shape (3 seeds far short
    of 95%, 5 and 10 close to 90%), not the third digit.
    """
    three, five, ten = (_coverage(n, 200, paired=False) for n in (3, 5, 10))
    assert three < 0.8 < five < 0.97 and 0.87 < ten < 0.98 and three < five < ten
    assert 0.82 < _coverage(5, 400, paired=True) < 0.96
    assert 0.89 < _coverage(10, 400, paired=True) < 0.98


def test_a_table_without_the_claims_column_measures_nothing_instead_of_failing(tmp_path):
    """A run evaluated on no episodes has no eval_return: the reward claim is unmeasured, the report goes on."""
    reward = next(s for s in claim_specs(current_only=True) if s.id == "gst_td3_reward")
    summary = pd.read_csv(RESULTS / "gst_td3_mujoco" / "medium" / "summary.csv").drop(columns="eval_return")
    summary.to_csv(tmp_path / "summary.csv", index=False)
    assert measure(reward, tmp_path, {}) is None
    with pytest.raises(ValueError, match="needs the columns 'method' and 'eval_return'"):
        measure_table(reward, summary)
