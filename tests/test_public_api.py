"""The library surface a user meets: what imports from where, and what a lean install needs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "ray",
    "papermill",
    "jupyterlab",
    "ale_py",
    "dm_control",
    "onnxruntime",
    "plotly",
    "rliable",
    "rl_zoo3",
)
"""Modules of the extras: importing the transforms and the SB3 callbacks must not load them."""


def test_transforms_and_callbacks_import_without_the_extras():
    code = (
        "import json, sys\n"
        "import rlq.compress, rlq.quant, rlq.sb3\n"
        "from rlq.sb3 import GSTCallback, GradualPruningCallback, QATCallback\n"
        "from rlq.compress import block_circulant_, magnitude_prune_\n"
        "from rlq.quant import ptq, bits_per_weight\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_callbacks_and_the_statistics_are_importable_by_their_public_names():
    import rlq
    import rlq.claims
    import rlq.stats
    from rlq.claims import claim_specs, judge
    from rlq.sb3 import GradualPruningCallback, GSTCallback, QATCallback
    from rlq.sb3.gst_callback import GSTCallback as Defined
    from rlq.stats import estimate

    assert GSTCallback is Defined and QATCallback.__module__ == "rlq.sb3.qat_callback"
    assert GradualPruningCallback.__module__ == "rlq.sb3.pruning_callback"
    assert rlq.stats is sys.modules["rlq.stats"] and rlq.claims.judge is judge and len(claim_specs()) > 5
    assert estimate([1.0, 2.0, 3.0, 4.0]).value == pytest.approx(2.5)  # IQM of 1..4
    with pytest.raises(AttributeError, match="no attribute"):
        rlq.sb3.NoSuchCallback  # noqa: B018


@pytest.mark.parametrize(
    "package", ["rlq.compress", "rlq.quant", "rlq.sb3", "rlq.deploy", "rlq.stats", "rlq.claims"]
)
def test_all_lists_what_a_user_calls_and_nothing_internal(package):
    import importlib

    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names)) and len(names) <= 40
    assert all(hasattr(module, name) for name in names)
    internal = [
        n for n in names if n.startswith("_") or any(w in n for w in ("cache", "park", "residue", "expand"))
    ]
    assert not internal, f"{package}.__all__ lists internals: {internal}"


def test_one_name_per_meaning_for_relative_changes():
    import rlq.quant
    import rlq.stats

    assert rlq.quant.relative_change(25, 100) == -0.75  # a fraction of the reference
    assert not hasattr(rlq.stats, "relative_change")  # its interval estimate in % is percent_change
    assert rlq.stats.percent_change([2.0] * 4, [1.0] * 4, reps=50).value == pytest.approx(100.0)


def test_the_api_page_is_generated_from_the_code():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, str(root / "tools" / "api_docs.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    page = (root / "docs" / "api.md").read_text()
    assert "| `GSTCallback` | class |" in page and "| `block_circulant_` | function |" in page
