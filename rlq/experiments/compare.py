"""Is a compressed method's return below dense training's by more than seed noise? (GST's "no reward drop")

Both GST notebooks judge the paper's "no reward drop" the same way: the drop of the compressed method's
mean return below the dense mean, in % of the dense mean, less one pooled standard deviation over seeds
(also in % of the dense mean). A drop within that noise counts as none; with one seed per method there
is no noise estimate and the whole drop counts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

RewardComparison = dict[str, float | None]


def _std(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def reward_drop_vs_dense(dense: Sequence[float], compressed: Sequence[float]) -> RewardComparison:
    """Return the compressed method's change vs dense, the seed noise and the drop beyond it, all in %.

    ``dense`` and ``compressed`` hold one return per seed. Keys: ``change_pct`` (100 * (compressed mean -
    dense mean) / |dense mean|), ``seed_std_pct`` (the two methods' standard deviations over seeds, pooled
    as the root of their mean square, in % of |dense mean|; 0 with one seed each) and
    ``drop_beyond_noise_pct`` (max(0, -change_pct - seed_std_pct)). All are None when either side has no
    value, or the dense mean is 0 (no scale for a percentage). NaN returns (a run that finished no episode)
    are left out.
    """
    dense = [float(x) for x in dense if not math.isnan(float(x))]  # NaN: a seed with no finished episode
    compressed = [float(x) for x in compressed if not math.isnan(float(x))]
    if any(math.isinf(x) for x in dense + compressed):
        raise ValueError(f"returns must be finite numbers, got dense {dense} and compressed {compressed}")
    empty: RewardComparison = {"change_pct": None, "seed_std_pct": None, "drop_beyond_noise_pct": None}
    if not dense or not compressed:
        return empty
    dense_mean, compressed_mean = statistics.fmean(dense), statistics.fmean(compressed)
    if dense_mean == 0:
        return empty
    scale = abs(dense_mean)
    change = 100 * (compressed_mean - dense_mean) / scale
    noise = 100 * math.sqrt((_std(dense) ** 2 + _std(compressed) ** 2) / 2) / scale
    return {"change_pct": change, "seed_std_pct": noise, "drop_beyond_noise_pct": max(0.0, -change - noise)}
