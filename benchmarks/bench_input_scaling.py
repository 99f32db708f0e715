"""int8 actions and returns of compiled actors with and without input scaling, on a published run's actors.

For every final actor a published ``gst_block_deploy`` run saved (``actors/<arm>__<seed>.npz``), with the
run's own settings (``params.json``): the TD3 agent is rebuilt around the actor, its observations collected
as the notebook collects them (calibration: ``calibration_steps`` from a rollout seeded ``seed + 2000``;
parity states: ``parity_steps`` seeded ``seed + 1000``), and the actor compiled at int8 twice,
``compile_policy(model, "int8")`` and ``compile_policy(model, "int8", calibration=...)``
(:mod:`rlq.deploy.input_scaling`). Printed per actor: the largest and mean action difference from PyTorch's
fp32 actor on the parity states, and each compiled actor's return over the run's evaluation episodes
(seeded as the notebook's), with its change against the fp32 return the run published. The first int8
columns are what the notebook measured; they are checked against its ``parity.csv`` and
``deployed_returns.csv`` before anything is printed. Not a timing: any load will do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlq.core.cpu import cpu_model
from rlq.deploy import compile_policy
from rlq.rl.agents import make_model
from rlq.rl.evaluate import EVAL_SEED_OFFSET, evaluate
from rlq.sb3.checkpoint import load_dense_actor
from rlq.sb3.gst_settings import td3_hyperparams
from rlq.sb3.quantized import collect_observations

RUN = Path(__file__).resolve().parents[1] / "data" / "results" / "gst_block_deploy" / "medium"


def agent(run: Path, params: dict, arm: str, seed: int):
    """Return the run's TD3 agent with the final actor of ``arm`` and ``seed`` (as the notebook rebuilds it)."""
    hyperparams = td3_hyperparams(
        params["total_timesteps"],
        learning_starts=params["learning_starts"],
        batch_size=params["batch_size"],
        action_noise_std=params["action_noise_std"],
        net_arch=params["net_arch"],
    )
    model = make_model("TD3", params["env_id"], seed=seed, hyperparams=hyperparams)
    return load_dense_actor(model, run / "actors" / f"{arm}__{seed}.npz")


def acting(compiled):
    """Return ``compiled`` as a policy of the env's float64 observations."""
    return lambda obs: compiled(np.asarray(obs, np.float32))


def measure(run: Path, params: dict, arm: str, seed: int) -> dict:
    """Return one actor's action differences and returns, int8 as published and int8 with input scaling."""
    env_id = params["env_id"]
    model = agent(run, params, arm, seed)
    states = collect_observations(env_id, params["parity_steps"], model=model, seed=seed + 1000).astype(
        np.float32
    )
    calibration = collect_observations(
        env_id, params["calibration_steps"], model=model, seed=seed + 2000
    ).astype(np.float32)
    reference, _ = model.predict(states, deterministic=True)
    row: dict = {"arm": arm, "seed": seed}
    for name, compiled in (
        ("int8", compile_policy(model, "int8")),
        ("int8 scaled", compile_policy(model, "int8", calibration=calibration)),
    ):
        difference = np.abs(compiled(states) - reference)
        row[f"max |{name} - fp32|"] = float(difference.max())
        row[f"mean |{name} - fp32|"] = float(difference.mean())
        row[f"{name} return"] = evaluate(
            acting(compiled), env_id, params["eval_episodes"], seed=seed + EVAL_SEED_OFFSET
        ).mean
    return row


def check_against_the_run(table: pd.DataFrame, run: Path) -> None:
    """Raise unless the int8 columns are what the run's notebook measured (same actors, states and episodes)."""
    parity = pd.read_csv(run / "parity.csv").set_index(["method", "seed"])
    returns = pd.read_csv(run / "deployed_returns.csv").set_index(["method", "seed"])
    for row in table.to_dict("records"):
        key = (row["arm"], row["seed"])
        for ours, theirs, table_name in (
            (row["max |int8 - fp32|"], parity.loc[key, "max |compiled - PyTorch|"], "parity.csv"),
            (row["int8 return"], returns.loc[key, "compiled int8 return"], "deployed_returns.csv"),
        ):
            if not np.isclose(ours, float(theirs), rtol=1e-4, atol=1e-6):
                raise SystemExit(
                    f"{key}: int8 gives {ours:.6f} here, the run's {table_name} {float(theirs):.6f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RUN, help="a published gst_block_deploy run folder")
    parser.add_argument("--seeds", type=int, nargs="*", help="a subset of the run's seeds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = json.loads((args.run / "params.json").read_text())
    seeds = args.seeds if args.seeds else params["seeds"]
    print(f"{args.run.name} run of gst_block_deploy ({params['env_id']}), {cpu_model()}")
    rows = [measure(args.run, params, arm, seed) for arm in params["arms"] for seed in seeds]
    table = pd.DataFrame(rows)
    check_against_the_run(table, args.run)
    fp32 = pd.read_csv(args.run / "deployed_returns.csv").set_index(["method", "seed"])["PyTorch fp32 return"]
    base = np.array([fp32[(a, s)] for a, s in zip(table.arm, table.seed, strict=True)])
    for name in ("int8", "int8 scaled"):
        table[f"{name} change (%)"] = 100 * (table[f"{name} return"] - base) / np.abs(base)
    pd.set_option("display.width", 200)
    print(table.round(4).to_string(index=False))
    for name in ("int8", "int8 scaled"):
        print(
            f"{name:>11}: largest action difference {table[f'max |{name} - fp32|'].min():.3f}-"
            f"{table[f'max |{name} - fp32|'].max():.3f} (mean over actors {table[f'mean |{name} - fp32|'].mean():.4f}); "
            f"return change {table[f'{name} change (%)'].min():+.1f}% to {table[f'{name} change (%)'].max():+.1f}%"
        )
    print(
        "int8 columns checked against the run's parity.csv and deployed_returns.csv; actions in [-1, 1]; "
        f"{params['parity_steps']} parity states and {params['eval_episodes']} evaluation episodes per actor"
    )


if __name__ == "__main__":
    main()
