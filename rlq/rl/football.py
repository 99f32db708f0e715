"""Google Research Football (Kurach et al. 2020, https://arxiv.org/abs/1907.11180) as a Gymnasium env.

Optional: ``gfootball`` has no wheel on PyPI; ``make football`` builds one once into a cache folder and
installs it with ``gym==0.25.2`` and ``six`` (see ``tools/football.sh``). Use it through
:func:`rlq.rl.envs.make_env` / :func:`rlq.rl.envs.make_vec_env` with ids ``gfootball/<scenario>``:

    env = make_env("gfootball/academy_empty_goal_close", seed=0)   # simple115v2 observations
    env = make_env("gfootball/academy_3_vs_1_with_keeper", representation="extracted")

What this module adds to gfootball's own ``create_environment``:

- **Gymnasium API** through shimmy's ``GymV21CompatibilityV0`` (gfootball subclasses the old ``gym.Env``).
- **Seeding that reaches the game engine.** gfootball ignores ``env.seed()``; its engine draws from the
  config value ``game_engine_random_seed``, which an unseeded gfootball env draws anew (unreproducibly) for
  every game. ``reset(seed=s)`` gives the engine ``s`` for that game and restarts the game count; each
  later ``reset()`` gives the next game its own seed, drawn from ``(s, game number)``
  (:func:`game_seed`). So a seeded env plays a different game every episode, as gfootball's own does, and
  two envs reset with the same seed and fed the same actions play the same games in the same order.
- **Time limits as truncation.** gfootball ends an episode that runs out of time with ``done=True``; here
  that comes back as ``truncated=True, terminated=False`` (the raw observation's ``steps_left`` is 0), so
  PPO bootstraps the value there instead of treating the time-out as a terminal state.
- No rendering (off-screen rendering costs about 0.76 s a frame on the CPU): pixel representations are
  refused.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import gymnasium as gym
import numpy as np

REPRESENTATIONS = ("simple115v2", "simple115", "extracted")
"""Observation representations without rendering: 115 floats (v2 fixes v1's encoding) or 4 minimaps."""
INSTALL_HINT = (
    "Google Research Football is not installed. Run `make football` in the rlq checkout: it installs "
    "Debian's build packages, builds the gfootball wheel once (about 8 minutes on 2 cores) into "
    "~/.cache/rlq and installs it with gym==0.25.2 and six."
)


def football_available() -> bool:
    """Return True when gfootball (and the gym it needs) can be imported."""
    try:
        _import_football()
    except ModuleNotFoundError:
        return False
    return True


def _import_football() -> Any:
    try:
        import gfootball.env as football_env
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"{INSTALL_HINT} (import failed: {error})") from error
    return football_env


@cache
def scenarios() -> tuple[str, ...]:
    """Return the names of gfootball's scenarios (e.g. ``academy_empty_goal_close``, ``11_vs_11_easy_stochastic``)."""
    _import_football()
    from gfootball.env import scenario_builder

    return tuple(sorted(scenario_builder.all_scenarios()))


def check_scenario(scenario: str) -> None:
    """Raise ValueError naming the known scenarios when ``scenario`` is not one (ModuleNotFoundError if not installed)."""
    known = scenarios()
    if scenario not in known:
        import difflib

        close = difflib.get_close_matches(scenario, known, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join('gfootball/' + c for c in close)}?" if close else ""
        raise ValueError(f"unknown football scenario {scenario!r}.{hint} Known: {', '.join(known)}")


def game_seed(seed: int, game: int) -> int:
    """Return the engine seed of game ``game`` (0 first) after ``reset(seed=seed)``: ``seed`` itself for the
    first game (as a 32-bit value), then a 32-bit draw from NumPy's ``SeedSequence([seed, game])``."""
    if game == 0:
        return seed & 0xFFFFFFFF
    return int(np.random.SeedSequence([seed, game]).generate_state(1)[0])


class FootballEnv(gym.Wrapper):
    """gfootball through shimmy, with engine seeding and time-outs reported as truncation."""

    def __init__(self, env: gym.Env, core: Any):
        super().__init__(env)
        self._core = core  # gfootball's FootballEnvCore: its config and raw observation
        self._seed: int | None = None  # the last reset's seed; None: gfootball draws every game's seed
        self._game = 0  # games started since that reset

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        config = self._core._config
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"seed must be an int >= 0, got {seed!r}")
            self._seed, self._game = int(seed), 0
            # gfootball fixes the team processing order from the seed's parity once, at the first episode
            config["reverse_team_processing"] = bool(self._seed % 2)
            config["episode_number"] = 0
            self.env.action_space.seed(self._seed)
        if self._seed is not None:
            config["game_engine_random_seed"] = game_seed(self._seed, self._game)
            self._game += 1
        obs, info = self.env.reset(options=options)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated and not truncated and self.steps_left() == 0:
            terminated, truncated = False, True
        return obs, reward, terminated, truncated, info

    def engine_seed(self) -> int:
        """Return the seed the game engine is configured with (``game_engine_random_seed``)."""
        return int(self._core._config["game_engine_random_seed"])

    def steps_left(self) -> int | None:
        """Return the game steps left in the current episode (None before the first reset)."""
        observation = getattr(self._core, "_observation", None)
        return None if observation is None else int(observation["steps_left"])


def make_football(
    scenario: str,
    representation: str = "simple115v2",
    rewards: str = "scoring",
    other_config_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> gym.Env:
    """Return the Gymnasium env of football ``scenario`` (unseeded: seed it with ``reset(seed=...)``).

    ``rewards`` is ``"scoring"`` or ``"scoring,checkpoints"``; ``kwargs`` go to gfootball's
    ``create_environment`` (e.g. ``number_of_left_players_agent_controls``).
    """
    if representation not in REPRESENTATIONS:
        raise ValueError(
            f"representation must be one of {REPRESENTATIONS} (pixels need rendering, 0.76 s a frame here), "
            f"got {representation!r}"
        )
    if rewards not in ("scoring", "scoring,checkpoints"):
        raise ValueError(f"rewards must be 'scoring' or 'scoring,checkpoints', got {rewards!r}")
    check_scenario(scenario)
    football_env = _import_football()
    from shimmy import GymV21CompatibilityV0

    for key in ("render", "write_video", "write_full_episode_dumps", "write_goal_dumps"):
        if kwargs.get(key):
            raise ValueError(
                f"{key}=True is not supported: rlq's football envs run without rendering or dumps"
            )
        kwargs.pop(key, None)
    raw = football_env.create_environment(
        env_name=scenario,
        representation=representation,
        rewards=rewards,
        render=False,
        other_config_options=dict(other_config_options or {}),
        **kwargs,
    )
    core = raw.unwrapped._env
    return FootballEnv(GymV21CompatibilityV0(env=raw), core)
