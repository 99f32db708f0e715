"""Finished episodes as Stable-Baselines3 reports them to callbacks: one reader for every callback."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def finished_episodes(infos: Iterable[Any] | None) -> list[tuple[float, int]]:
    """Return ``(return, length)`` of every episode that ended in this step, in env order.

    ``infos`` is SB3's ``self.locals["infos"]`` in a callback: one info per env, where SB3's ``Monitor``
    wrapper adds ``{"episode": {"r": return, "l": length, "t": seconds}}`` when an episode ends. Infos that
    are not dicts (None, or what a foreign wrapper puts there) and dicts without ``"episode"`` are skipped.
    """
    episodes = []
    for info in infos or ():
        episode = info.get("episode") if isinstance(info, dict) else None
        if episode is not None:
            episodes.append((float(episode["r"]), int(episode["l"])))
    return episodes
