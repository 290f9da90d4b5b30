"""Ablations: plan the variants of a recipe, run them as a campaign, analyse the result.

* :mod:`.planner`: ablation files and specs, variants, companions, the plan of runs (pure);
* :mod:`.campaign`: the manifest, the cost, reuse of stored runs, launching, watching, cancelling:
  ``scalectl ablate`` is its :func:`~.campaign.prepare` and :func:`~.campaign.run`;
* :mod:`.analysis`: fits, verdicts against the baseline and a sentence per variant;
* :mod:`.report`: the report (figures, HTML, Markdown);
* :mod:`.decisions`, :mod:`.adaptive`, :mod:`.power`: an adaptive ablation's rules after
  each stage, its decision loop (in-process backends included), and power planning;
* :mod:`.staged`: an adaptive ablation against the store (its runs and stages, the power plan's inputs);
* :mod:`.until_decided`: ``ablate --until-decided`` and ``--plan`` (prepare, then run or power).

The planner's names are available here too (``from scalectl.ablation import plan``).
"""

from scalectl.ablation.planner import (
    BASE, DEFAULT_BASE_RECIPE, KINDS, SCALERL_LOO, SEP, AblationSpec, Change, Plan, PlannedRun, PlannedVariant,
    VariantSpec, check_part, diff, format_value, forward_spec, leave_one_out_spec, parse_forward, parse_run_name,
    plan, read_ablation, run_name, with_companions,
)

__all__ = ["BASE", "DEFAULT_BASE_RECIPE", "KINDS", "SCALERL_LOO", "SEP", "AblationSpec", "Change", "Plan",
           "PlannedRun", "PlannedVariant", "VariantSpec", "check_part", "diff", "format_value", "forward_spec",
           "leave_one_out_spec", "parse_forward", "parse_run_name", "plan", "read_ablation", "run_name",
           "with_companions"]
