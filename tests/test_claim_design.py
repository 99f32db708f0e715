"""The confirmatory design: every registered claim can hold and can fail, the test covers, the jobs add up."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rlq.claims import confirmatory_statistics as cs
from rlq.claims.campaign_jobs import job_overrides, registered_jobs
from rlq.claims.design import (
    RUNS_REMAINING,
    SEED_START,
    core_hours,
    judge,
    judge_joint,
    read_design,
    simulated_values,
)
from rlq.experiments.paths import data_dir

DESIGN = read_design()
BY_ID = {c.id: c for c in DESIGN}
DECIDED_BY_RUNS = [c for c in DESIGN if c.runs]


def published_table(claim, values: np.ndarray) -> pd.DataFrame:
    """Return a published table whose rows give ``values`` as the claim's per-seed statistic."""
    base = 200.0
    rows = []
    for i, value in enumerate(values):
        keys = {"seed": SEED_START + i, "task": "t"}
        common = {**keys, **{col: accepted[0] for col, accepted in claim.rows}}
        if claim.statistic == "t_mean":
            method = value / claim.scale
        elif claim.statistic == "t_paired_difference":
            method = base + value / claim.scale
        else:
            method = base * (1 + value / 100.0)
        for arm, metric in ((claim.method, method), (claim.reference, base)):
            if arm:
                row = {**common, claim.by: arm}
                numerator, _, denominator = claim.column.partition("/")
                row[numerator] = metric
                if denominator:
                    row[denominator] = 1.0
                rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("claim", DECIDED_BY_RUNS, ids=lambda c: c.id)
def test_each_claim_holds_when_the_method_equals_its_baseline_and_fails_when_it_loses_twice_the_margin(claim):
    good = judge(claim, published_table(claim, simulated_values(claim, 1.0)), complete=True)
    bad = judge(claim, published_table(claim, simulated_values(claim, -1.0)), complete=True)
    assert good.outcome == "holds", good
    assert bad.outcome == "does not hold", bad
    assert good.n == bad.n == claim.seeds


@pytest.mark.parametrize("claim", DECIDED_BY_RUNS, ids=lambda c: c.id)
def test_the_simulated_samples_have_the_asked_mean_and_spread(claim):
    for shift in (1.0, -1.0):
        values = simulated_values(claim, shift)
        side = 1.0 if claim.direction == ">=" else -1.0
        assert values.mean() == pytest.approx(claim.threshold + side * shift * claim.design_distance)
        assert values.std(ddof=1) == pytest.approx(claim.design_sd)


def test_a_non_inferiority_claim_meets_its_margin_exactly_as_the_issue_words_it():
    claim = BY_ID["gst_td3_reward"]
    assert simulated_values(claim, 1.0).mean() == pytest.approx(0.0)  # GST equals dense
    assert simulated_values(claim, -1.0).mean() == pytest.approx(-20.0)  # GST loses twice the 10% margin


@pytest.mark.parametrize("claim", [c for c in DESIGN if c.statistic == "joint"], ids=lambda c: c.id)
def test_joint_claims_hold_only_when_every_part_holds(claim):
    parts = [BY_ID[p] for p in claim.parts]
    held = [judge(p, published_table(p, simulated_values(p, 1.0)), True) for p in parts]
    failed = [judge(parts[0], published_table(parts[0], simulated_values(parts[0], -1.0)), True), *held[1:]]
    remaining = [judge(parts[0], None, False), *held[1:]]
    assert judge_joint(claim, held).outcome == "holds"
    assert judge_joint(claim, failed).outcome == "does not hold"
    assert judge_joint(claim, remaining).outcome == RUNS_REMAINING


def test_a_by_design_part_does_not_make_a_joint_claim_hold():
    gain, reward = BY_ID["gst_td3_gain"], BY_ID["gst_td3_reward"]
    fixed = published_table(gain, np.full(gain.seeds, 27.0))
    outcome = judge(gain, fixed, True)
    assert outcome.outcome == "by design" and "reaches" in outcome.reason
    held = judge(reward, published_table(reward, simulated_values(reward, 1.0)), True)
    assert judge_joint(BY_ID["gst_td3_joint"], [outcome, held]).outcome == "by design"


@pytest.mark.parametrize("n", sorted({c.seeds for c in DECIDED_BY_RUNS}))
def test_the_one_sided_t_bound_covers_at_least_94_percent_at_each_registered_n(n):
    assert cs.coverage(n, draws=20_000, seed=n) >= 0.94


def test_the_t_bounds_match_an_independent_computation():
    x = np.array([3.0, -1.0, 4.0, 1.5, 9.0, 2.0])
    got = cs.t_bounds(x)
    half = stats.t.ppf(0.95, 5) * x.std(ddof=1) / np.sqrt(6)
    assert (got.lower, got.upper) == pytest.approx((x.mean() - half, x.mean() + half))
    assert cs.outcome(got, ">=", got.lower - 1e-9) == "holds"
    assert cs.outcome(got, ">=", got.upper + 1e-9) == "does not hold"
    assert cs.outcome(got, ">=", x.mean()) == "inconclusive"
    assert cs.outcome(got, "<=", got.upper + 1e-9) == "holds"


def test_power_matches_a_simulation_of_the_test():
    n, sd, distance = 8, 10.0, 10.0
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, sd, (20_000, n))  # the true mean lies `distance` above the threshold -10
    lower = x.mean(axis=1) - stats.t.ppf(0.95, n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
    assert np.mean(lower >= -distance) == pytest.approx(cs.power(n, sd, distance), abs=0.01)


@pytest.mark.parametrize("claim", DECIDED_BY_RUNS, ids=lambda c: c.id)
def test_each_registered_seed_count_reaches_80_percent_power_at_its_design(claim):
    assert claim.seeds >= 5
    assert claim.power() >= cs.TARGET_POWER


@pytest.mark.parametrize(
    "claim", [c for c in DESIGN if c.registered_outcome == "underpowered at our budget"], ids=lambda c: c.id
)
def test_an_underpowered_claim_cannot_reach_80_percent_within_20_seeds(claim):
    assert cs.seeds_for_power(claim.design_sd, claim.design_distance, max_n=20) is None
    assert cs.power(20, claim.design_sd, claim.design_distance) < cs.TARGET_POWER


def test_the_jobs_are_fresh_seeds_once_each_within_the_budget():
    jobs = registered_jobs(DESIGN)
    assert len({j.key for j in jobs}) == len(jobs)
    assert all(j.seed >= SEED_START for j in jobs if not j.pilot)
    assert all(j.seed < SEED_START for j in jobs if j.pilot)
    assert core_hours(DESIGN) <= 42
    assert jobs[0].experiment == "gst_td3_mujoco" and jobs[0].preset == "long"  # the headline claim first
    assert [j.priority for j in jobs] == sorted(j.priority for j in jobs)
    for job in jobs:
        assert job_overrides(job.experiment, job.arm, job.seed)["workers"] == 1


def test_every_job_resolves_against_its_notebook_preset():
    from rlq.experiments.registry import get_experiment

    for job in registered_jobs(DESIGN):
        experiment = get_experiment(job.experiment)
        overrides = job_overrides(job.experiment, job.arm, job.seed)
        params = experiment.resolve(job.preset)
        assert set(overrides) <= set(params), job
        for name, value in overrides.items():
            experiment.parameters[name].check(value)


def test_a_pilot_below_the_floor_makes_the_claim_uninformative():
    claim = BY_ID["gst_football_reward"]
    assert judge(claim, None, False, pilot=0.05).outcome == "uninformative (floor)"
    assert judge(claim, None, False, pilot=0.5).outcome == RUNS_REMAINING


def test_a_claim_at_the_ceiling_on_every_seed_is_uninformative():
    claim = BY_ID["gst_football_reward"]
    table = published_table(claim, np.zeros(claim.seeds))
    table[claim.column] = 1.0
    assert judge(claim, table, True).outcome == "uninformative (ceiling)"


def test_a_malformed_design_row_is_refused_naming_its_line_and_field(tmp_path):
    lines = (data_dir() / "claims_confirmatory.csv").read_text().splitlines()
    lines[1] = lines[1].replace("t_paired_difference", "t_wrong", 1)
    design = tmp_path / "design.csv"
    design.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"line 2 \('gst_td3_gain'\): statistic 't_wrong'"):
        read_design(design)


def test_a_fixed_reference_pairs_with_every_seed_and_a_varying_one_only_with_its_own():
    claim = BY_ID["gst_td3_gain"]
    seeds = [SEED_START + i for i in range(claim.seeds)]
    gst = [
        {"env_id": "HalfCheetah-v5", "seed": s, "method": "gst", "avg_compression_ratio": 0.81} for s in seeds
    ]
    fixed = [{"env_id": "HalfCheetah-v5", "seed": s, "method": "pruning", "avg_compression_ratio": 0.54 + 1e-12 * i}
             for i, s in enumerate(seeds[:2])]  # fmt: skip
    got = judge(claim, pd.DataFrame(gst + fixed), complete=True)
    assert got.n == claim.seeds and got.outcome == "by design" and "27" in got.reason
    varying = [{**row, "avg_compression_ratio": 0.5 + 0.01 * i} for i, row in enumerate(fixed)]
    got = judge(claim, pd.DataFrame(gst + varying), complete=True)
    assert got.n == 2 and got.outcome == "too few seeds"
    assert judge(claim, pd.DataFrame(gst + varying), complete=False).outcome == RUNS_REMAINING


def test_exploratory_seeds_below_the_confirmatory_start_never_count():
    claim = BY_ID["gst_td3_reward"]
    table = published_table(claim, simulated_values(claim, 1.0))
    early = table.assign(seed=table["seed"] - SEED_START)  # the same values on seeds 0-9
    got = judge(claim, pd.concat([table.iloc[:4], early]), complete=True)
    assert got.outcome == "too few seeds" and got.n == 2
