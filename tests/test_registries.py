"""One table per list of choices: the recipe's allowed values agree with the registries
that act on them, and shared facts live in one place."""

from __future__ import annotations

import typing

import pytest

from scalectl.defaults import MARGIN, TRUNCATION_THRESHOLD
from scalectl.points import POINT_FIELDS, EvalPoint
from scalectl.recipe.launcher_choices import DEFAULT_LAUNCHER, LAUNCHER_NAMES
from scalectl.recipe.schema import Fit, Launcher
from scalectl.store.database import EVAL_POINT_COLUMNS


def test_every_launcher_name_is_implemented():
    """``launcher.type`` accepts the names of one torch-free table; the registry maps each
    to the module and class of a launcher of that name."""
    from scalectl.launch.base import Launcher as LauncherBase
    from scalectl.launch.registry import LAUNCHER_TYPES, LAUNCHERS, launcher_class

    assert typing.get_args(Launcher.model_fields["type"].annotation) == LAUNCHER_NAMES
    assert Launcher().type == DEFAULT_LAUNCHER in LAUNCHER_NAMES
    assert tuple(LAUNCHERS) == LAUNCHER_TYPES == LAUNCHER_NAMES
    for name in LAUNCHER_NAMES:
        cls = launcher_class(name)
        assert issubclass(cls, LauncherBase) and cls.name == name


def test_eval_point_is_the_stores_columns():
    assert list(EVAL_POINT_COLUMNS) == ["run_id", *POINT_FIELDS, "time"]
    assert set(POINT_FIELDS) == set(EvalPoint.__dataclass_fields__)
    with pytest.raises(ValueError, match="unknown eval point keys \\['logp_gap'\\]"):
        EvalPoint.from_dict({"step": 1, "pass_rate": 0.5, "logp_gap": 0.1})


def test_defaults_are_the_papers():
    assert (MARGIN, TRUNCATION_THRESHOLD) == (0.02, 0.10)
    assert Fit().truncation_threshold == TRUNCATION_THRESHOLD


def test_fit_window_rule():
    from scalectl.curve import default_min_compute
    from scalectl.science.fits import fit_window

    x = [0.0, 1.0, 2.0, 4.0, 8.0]
    assert fit_window({"axis": "flops", "min_compute": 3}, "flops", x, override=0.5) == 0.5   # --min-compute
    assert fit_window({"axis": "flops", "min_compute": 3}, "flops", x) == 3.0                 # the recipe's
    # a bound given on another axis means nothing on this one: the default rule
    assert fit_window({"axis": "gpu_hours", "min_compute": 3}, "flops", x) == default_min_compute(x, "flops")
    assert fit_window({}, "step", x) == default_min_compute(x, "step")
