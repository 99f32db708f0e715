"""GST tables: returns per phase of training."""

from __future__ import annotations

import pandas as pd
import pytest


def test_phase_returns_averages_each_phase_of_each_run():
    from rlq.analysis.gst.tables import phase_returns

    curve = pd.DataFrame(
        dict(
            timestep=[10, 40, 50, 60, 90, 100, 20, 70],
            episode_return=[1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 2.0, 4.0],
            seed=[0, 0, 0, 0, 0, 0, 1, 1],
            method=["gst"] * 6 + ["dense"] * 2,
        )
    )
    table = phase_returns(curve, total_timesteps=100, edges=(0.0, 0.5, 1.0))
    assert list(table.columns) == ["method", "seed", "0-50%", "50-100%"]
    gst = table[table.method == "gst"].iloc[0]
    assert gst["0-50%"] == pytest.approx((1 + 3 + 5) / 3)  # step 50 closes the first phase
    assert gst["50-100%"] == pytest.approx((7 + 9 + 11) / 3)  # the last edge is included
    dense = table[table.method == "dense"].iloc[0]
    assert (dense["0-50%"], dense["50-100%"]) == (2.0, 4.0)
    with pytest.raises(ValueError, match="increasing"):
        phase_returns(curve, 100, edges=(0.5, 0.5))
    with pytest.raises(ValueError, match="lacks"):
        phase_returns(curve.drop(columns="seed"), 100)
