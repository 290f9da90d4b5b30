"""The noise margin on the ceiling A: the paper's default, a given one, or the user's own,
measured from repeated runs (seeds) of one recipe in the store.

Ceilings closer than the margin are a tie (:mod:`scalectl.science.compare`).  The paper's
0.02 comes from three ScaleRL runs of an 8B model on Polaris-53K whose ceilings lay within
+-0.015 of each other; it took that largest deviation and rounded it up (Khatri et al. 2025,
arXiv 2510.13786, section 3).  Another model, prompt set or evaluation size has another
seed-to-seed spread, so a margin can be measured here (docs/fitting.md, "Your own margin"):

* **the rule**: margin = :data:`K_SD` x s_A, where s_A is the sample standard deviation
  (n - 1 in the denominator) of the fitted ceilings of n >= :data:`MIN_RUNS` completed runs
  of one recipe content hash (hence one setup: the hash covers model, data, batch, budget).
  Two times the sd is the half-width of the range that about 95 % of single runs' ceilings
  fall in around the recipe's own ceiling (normal seed noise): a difference below it is what
  repeating the recipe gives anyway.  (The paper's 0.02 is 1.3 x its +-0.015.)
* **its interval**: the chi-square interval of a normal sd, s sqrt((n - 1) / chi2_{1-a/2, n-1})
  to s sqrt((n - 1) / chi2_{a/2, n-1}), times K_SD, at ``level`` (1 - a).  With 3 runs it
  spans 0.52 s to 6.3 s: three seeds measure a margin only roughly; each further seed
  narrows it.
* **the paper's rule on the same runs**, for comparison: the largest |A_i - mean A| rounded
  up to a multiple of 0.01 (+-0.015 -> 0.02).
* **what the spread is made of**: each fit's own uncertainty on A, its interval's half-width
  over the normal quantile of its level (1.96 at 95 %), has the root mean square s_fit; the
  part of s_A it does not explain, s_run = sqrt(max(s_A^2 - s_fit^2, 0)), is what the runs
  themselves differ by.  When s_fit is most of s_A, longer runs or a larger evaluation
  narrow the margin; when s_run is, only the recipe or the setup does.

A run's ceiling counts only when its fit identifies it: fits flagged
``ceiling_not_identified`` or with A on a bound are left out, and named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scalectl.defaults import IDENTIFY_REACH, MARGIN
from scalectl.errors import UserError

#: Fewest completed runs of one recipe hash a margin is measured from.
MIN_RUNS = 3
#: Margin = K_SD x the seed-to-seed standard deviation of the ceiling A.
K_SD = 2.0
#: The paper's rule rounds the largest deviation up to a multiple of this.
PAPER_STEP = 0.01
#: Where each kind of margin comes from.
PAPER, GIVEN, FILE, MEASURED = "paper", "given", "file", "measured"
#: The paper's default, as a sentence.
PAPER_WHERE = ("the paper's default: three 8B ScaleRL runs within +-0.015, rounded up; "
               "`scalectl margin` measures your own")


@dataclass(frozen=True)
class Margin:
    """A noise margin on A (pass rate, absolute) and where it came from.

    ``source``: :data:`PAPER`, :data:`GIVEN` (``--margin``), :data:`FILE` (an ablation
    file's ``margin``) or :data:`MEASURED`; ``where`` says it in words.  A measured margin
    also has its ``interval`` at ``level``, the runs it was measured from, their ceilings'
    mean and sd, the recipe hash and the paper's rule on the same runs (``paper_rule``);
    ``left_out`` names the runs whose ceilings were not identified; ``fit_sd`` is the root
    mean square of the fits' own standard errors on A, and :attr:`run_sd` the rest of ``sd``.
    """

    value: float
    source: str
    where: str
    interval: tuple[float, float] | None = None
    level: float | None = None
    runs: tuple[str, ...] = ()
    ceilings: tuple[float, ...] = ()
    mean: float | None = None
    sd: float | None = None
    recipe_hash: str | None = None
    paper_rule: float | None = None
    left_out: tuple[str, ...] = field(default=())
    fit_sd: float | None = None

    @property
    def run_sd(self) -> float | None:
        """The part of the ceilings' sd that the fits' own uncertainty does not explain:
        sqrt(max(sd^2 - fit_sd^2, 0)) (module docstring); None without both."""
        if self.sd is None or self.fit_sd is None:
            return None
        return math.sqrt(max(self.sd ** 2 - self.fit_sd ** 2, 0.0))

    def line(self) -> str:
        """'margin 0.024 [0.013, 0.15] (measured from ...)': what a command prints."""
        iv = "" if self.interval is None else f" [{self.interval[0]:.3g}, {self.interval[1]:.3g}]"
        return f"margin {self.value:.3g}{iv} ({self.where})"

    def to_dict(self) -> dict:
        """JSON-ready: every field."""
        return {"value": self.value, "source": self.source, "where": self.where,
                "interval": None if self.interval is None else list(self.interval), "level": self.level,
                "runs": list(self.runs), "ceilings": list(self.ceilings), "mean": self.mean, "sd": self.sd,
                "recipe_hash": self.recipe_hash, "rule": f"{K_SD:g} x the sd of A over the runs"
                if self.source == MEASURED else None, "paper_rule": self.paper_rule,
                "left_out": list(self.left_out), "fit_sd": self.fit_sd, "run_sd": self.run_sd}


def check_value(value: float, what: str = "margin") -> float:
    """``value`` if it is a usable margin: a finite number > 0 and < 1 (a pass rate difference).

    Raises:
        UserError: naming ``what``, the value and what is allowed.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value < 1:
        raise UserError(f"{what} = {value!r} must be a finite number > 0 and < 1 (a difference of pass rates; "
                        f"the paper's is {MARGIN:g})")
    return float(value)


def paper() -> Margin:
    """The paper's default margin (:data:`scalectl.defaults.MARGIN`)."""
    return Margin(MARGIN, PAPER, PAPER_WHERE)


def given(value: float, where: str = "") -> Margin:
    """A margin the user gave (``--margin 0.03``): checked by :func:`check_value`."""
    return Margin(check_value(value), GIVEN, where or f"given: --margin {value:g}")


def from_ceilings(ceilings: Sequence[float], runs: Sequence[str], *, level: float = 0.95,
                  recipe_hash: str | None = None, left_out: Sequence[str] = (),
                  standard_errors: Sequence[float] | None = None) -> Margin:
    """The margin measured from the fitted ceilings A (pass rates) of repeated runs (module
    docstring: K_SD x their sd, with its chi-square interval at ``level``).  ``standard_errors``:
    each fit's own standard error on its A (:meth:`scalectl.curve.SigmoidFit.standard_error`), one per ceiling, whose
    root mean square becomes ``fit_sd``.

    Raises:
        UserError: fewer than :data:`MIN_RUNS` ceilings, a level outside (0, 1), or ceilings
            with no spread (the same run stored several times?).
    """
    from scipy.stats import chi2

    a = [float(x) for x in ceilings]
    n = len(a)
    if n < MIN_RUNS:
        raise UserError(f"a margin needs the ceilings of at least {MIN_RUNS} runs of one recipe; "
                        f"{n} given ({', '.join(runs) or 'none'})")
    if not 0 < level < 1:
        raise UserError(f"level = {level!r} must lie strictly between 0 and 1")
    mean = sum(a) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in a) / (n - 1))
    if not sd > 0:
        raise UserError(f"the ceilings of {', '.join(runs)} are all {mean:.4f}: no spread to measure a margin "
                        "from (are they one run stored several times?)")
    q = (1 - level) / 2
    lo, hi = (K_SD * sd * math.sqrt((n - 1) / chi2.ppf(p, n - 1)) for p in (1 - q, q))
    worst = max(abs(x - mean) for x in a)
    rule = math.ceil(round(worst / PAPER_STEP, 9)) * PAPER_STEP
    where = (f"measured: {K_SD:g} x the sd {sd:.4f} of A over {n} runs"
             + (f" of recipe {recipe_hash}" if recipe_hash else "") + f" ({', '.join(runs)}); "
             f"{level:.0%} chi-square interval; the paper's rule on them gives {rule:.2g}")
    fit_sd = None
    if standard_errors is not None:
        if len(standard_errors) != n:
            raise ValueError(f"{len(standard_errors)} standard errors for {n} ceilings")
        fit_sd = math.sqrt(sum(float(e) ** 2 for e in standard_errors) / n)
        where += f"; the fits' own uncertainty on A: sd {fit_sd:.4f}"
    return Margin(check_value(K_SD * sd, "measured margin"), MEASURED, where, (lo, hi), level, tuple(runs),
                  tuple(a), mean, sd, recipe_hash, rule, tuple(left_out), fit_sd)


# --------------------------------------------------------------------------- from the store


AUTO = "auto"


def parse_choice(text: str | float | None, what: str = "--margin") -> float | str | None:
    """A margin as the command line gives it: None (the default), ``auto`` (measured), or a
    number (:func:`check_value`).

    Raises:
        UserError: anything else, naming ``what``.
    """
    if text is None or text == AUTO:
        return text
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{what} {text!r} is not a number or 'auto' (measured from the seeds in the store: "
                        "`scalectl margin`)") from None
    return check_value(value, what)


def seed_groups(store) -> dict[str, list[dict]]:
    """The completed runs of the store that have a recipe hash, by hash, oldest first."""
    groups: dict[str, list[dict]] = {}
    for run in store.list_runs():
        if run.get("status") == "completed" and run.get("recipe_hash"):
            groups.setdefault(run["recipe_hash"], []).append(run)
    return groups


def _identified(fit) -> bool:
    """Whether a fit pins its ceiling: no ``ceiling_not_identified`` flag, neither A nor its
    interval on a bound (:meth:`scalectl.curve.SigmoidFit.ceiling_problems`)."""
    return not fit.ceiling_problems(interval_bound=True)


def measure(store, runs: Sequence[dict], opts, *, level: float = 0.95, recipe_hash: str | None = None,
            until: dict[int, int] | None = None) -> Margin:
    """The margin measured from stored ``runs`` (seeds of one recipe), each fitted with ``opts``
    (a :class:`scalectl.science.fits.FitOptions`; stored fits reused): :func:`from_ceilings`
    of the runs whose fits identify the ceiling.  ``until``: run id -> the step up to which that
    run is fitted, for runs of the same recipe trained further (:func:`trained_further`): their
    hash is the longer budget's, and they count as runs of ``recipe_hash``.  Runs of one recipe
    at different budgets (one extended since, say) are each fitted up to the smallest budget
    among them (:func:`_common_budget`): the runs of that budget, as the seeds of one hash are.

    Raises:
        UserError: runs of different recipes, a run that cannot be fitted, or fewer than
            :data:`MIN_RUNS` identified ceilings (naming the runs left out).
    """
    from dataclasses import replace

    from scalectl.science.fits import fit_run

    until = dict(until or {})
    hashes = {r.get("recipe_hash") for r in runs if r.get("recipe_hash") and r["id"] not in until}
    if len(hashes) > 1:
        common = _common_budget(runs)
        if common is None:
            raise UserError("a margin is measured from runs of one recipe: "
                            + ", ".join(f"{r['name']} ({r.get('recipe_hash') or 'no hash'})" for r in runs))
        steps, recipe_hash = common
        until.update({r["id"]: steps for r in runs if r.get("recipe_hash") != recipe_hash})
    ceilings, names, left_out, ses = [], [], [], []
    for run in runs:
        fit = fit_run(store, run, opts if run["id"] not in until else replace(opts, until_step=until[run["id"]]))[0].fit
        if _identified(fit):
            ceilings.append(fit.A)
            names.append(run["name"])
            ses.append(fit.standard_error("A"))
        else:
            left_out.append(run["name"])
    if len(ceilings) < MIN_RUNS:
        why = (f" ({', '.join(left_out)}: ceiling not identified, extend them to about {IDENTIFY_REACH:g} x C_mid, "
               "the rule of enough data: docs/fitting.md)") if left_out else ""
        raise UserError(f"a margin needs at least {MIN_RUNS} completed runs of one recipe whose fits identify "
                        f"the ceiling; {len(ceilings)} found{why}")
    recipe_hash = recipe_hash or next((r.get("recipe_hash") for r in runs if r["id"] not in until), None)
    return from_ceilings(ceilings, names, level=level, recipe_hash=recipe_hash, left_out=left_out,
                         standard_errors=None if None in ses else ses)


def measure_until(store, runs: Sequence[dict], opts, steps: int, *, level: float = 0.95) -> Margin:
    """The margin of ``runs`` (seeds of one recipe content, whatever budget each was trained to)
    read as runs of ``steps`` steps: each fitted on its points up to that step (:func:`measure`
    with ``until``), as a run extended past its budget still holds the shorter run's points.

    Raises:
        UserError: ``steps`` < 1, runs of different recipe contents
            (:func:`scalectl.recipe.schema.training_key`) or without a stored recipe, a run whose
            points stop before ``steps`` (naming it and its last step), or what :func:`measure` raises.
    """
    from scalectl.recipe.schema import hash_at_budget, training_key

    if steps < 1:
        raise UserError(f"--until-step must be a step >= 1 (given {steps})")
    keys = {r["name"]: training_key(r["recipe"]) if r.get("recipe") else None for r in runs}
    if None in keys.values() or len(set(keys.values())) > 1:
        raise UserError("--until-step reads seeds of one recipe content (budgets aside): "
                        + ", ".join(f"{r['name']} ({r.get('recipe_hash') or 'no recipe'})" for r in runs))
    last = {r["id"]: r.get("last_step") or 0 for r in store.list_runs()}
    short = [f"{r['name']} (last step {last.get(r['id'], 0)})" for r in runs if last.get(r["id"], 0) < steps]
    if short:
        raise UserError(f"--until-step {steps}: run(s) not trained that far: {', '.join(short)}")
    return measure(store, runs, opts, level=level, recipe_hash=hash_at_budget(runs[0]["recipe"], steps),
                   until={r["id"]: steps for r in runs})


def _common_budget(runs: Sequence[dict]) -> tuple[int, str] | None:
    """For runs of one recipe trained to different budgets (the same content hash once the budget
    is left out: :func:`scalectl.recipe.schema.training_key`; one extended, say): (the smallest
    ``budget.steps`` among them, the recipe hash of a run of that budget); None when they are of
    different recipes, lack a stored recipe or a step budget, or a run has not reached that step."""
    from scalectl.recipe.schema import training_key

    keys = {training_key(r["recipe"]) if r.get("recipe") else None for r in runs}
    if len(keys) != 1 or None in keys:
        return None
    budgets = [(r["recipe"].get("budget") or {}).get("steps") for r in runs]
    if None in budgets:
        return None
    steps = min(budgets)
    if any((r.get("last_step") or steps) < steps for r in runs):
        return None
    return steps, next(r["recipe_hash"] for r, b in zip(runs, budgets) if b == steps)


def trained_further(store, recipe, have: Sequence[dict] = ()) -> list[dict]:
    """Completed runs of ``recipe`` (a :class:`scalectl.recipe.schema.Recipe`) trained beyond its
    ``budget.steps``, each of a seed not among ``have``: the same recipe content whatever the budget
    (:func:`scalectl.recipe.schema.training_key`) and points up to that step at least.  Their points up
    to it are the runs of the recipe's budget (the budget only says when training stops), as an
    adaptive ablation's extended base run is still its seed of the first budget.  One per seed (the
    oldest), oldest first."""
    from scalectl.recipe.schema import training_key

    steps = recipe.budget.steps
    if steps is None:
        return []
    key, seeds, found = training_key(recipe), {r.get("seed") for r in have}, []
    for r in store.list_runs():
        if (r.get("status") != "completed" or r.get("seed") in seeds or r.get("recipe_hash") == recipe.content_hash
                or (r.get("last_step") or 0) < steps or not r.get("recipe")):
            continue
        if training_key(r["recipe"]) == key:
            found.append(r)
            seeds.add(r.get("seed"))
    return found


def measure_hash(store, recipe_hash: str, opts, *, level: float = 0.95, recipe=None) -> Margin:
    """The margin measured from every completed run of ``recipe_hash`` in the store (:func:`measure`);
    given the ``recipe`` of that hash, also from the runs of its other seeds trained further
    (:func:`trained_further`), each fitted on its points up to the recipe's budget.

    Raises:
        UserError: fewer than :data:`MIN_RUNS` such runs, saying how to train the others.
    """
    runs = seed_groups(store).get(recipe_hash, [])
    runs += trained_further(store, recipe, runs) if recipe is not None else []
    if len(runs) < MIN_RUNS:
        have = f": {', '.join(r['name'] for r in runs)}" if runs else ""
        raise UserError(f"--margin auto needs at least {MIN_RUNS} completed runs of recipe {recipe_hash}; the store "
                        f"holds {len(runs)}{have}. Train {MIN_RUNS - len(runs)} more seed(s) "
                        "(`scalectl run RECIPE --seed N`, or `scalectl ablate ... --repeats 3`; `ablate --plan` "
                        "plans them), or give --margin NUMBER")
    until = {r["id"]: recipe.budget.steps for r in runs if r.get("recipe_hash") != recipe_hash}
    return measure(store, runs, opts, level=level, recipe_hash=recipe_hash, until=until)


def resolve(store, choice: float | str | None, recipe_hash: str | None, opts, *, fallback: Margin | None = None,
            level: float = 0.95, recipe=None) -> Margin:
    """The margin a command uses: ``choice`` None -> ``fallback`` (default the paper's), a
    number -> given, ``auto`` -> measured from the seeds of ``recipe_hash`` (:func:`measure_hash`;
    ``recipe``: that hash's recipe, whose seeds trained further count too).

    Raises:
        UserError: ``auto`` without a recipe hash (an imported baseline) or without enough seeds.
    """
    if choice is None:
        return fallback or paper()
    if choice != AUTO:
        return given(float(choice))
    if not recipe_hash:
        raise UserError("--margin auto measures the baseline recipe's seeds, but the baseline has no recipe hash "
                        "(an imported run): name its seeds, `scalectl margin RUN RUN RUN`, then give --margin NUMBER")
    return measure_hash(store, recipe_hash, opts, level=level, recipe=recipe)


def for_ablation(store, choice: float | str | None, declared: float | str | None, where: str,
                 recipe_hash: str | None, opts, *, level: float = 0.95, recipe=None) -> Margin:
    """The margin an ablation's verdicts use: ``--margin`` (``choice``) when given; else the
    ablation's ``margin`` (``declared``, a number or ``auto``; ``where`` names where it was set:
    ``margin = 0.03 in FILE``, ``given: --margin 0.03`` (the command line, recorded in the
    manifest), "" for none); else the paper's.  ``auto`` is measured from the seeds of the baseline's
    ``recipe_hash`` in ``store`` (:func:`measure_hash`; with the baseline's ``recipe``, its seeds
    trained further count too, fitted up to its budget).

    Raises:
        UserError: ``auto`` without a store, a hash or enough seeds.
    """
    if choice is None and declared == AUTO:
        choice = AUTO
    if choice == AUTO and store is None:
        raise UserError("--margin auto measures the baseline's seeds in the store, and there is no store yet")
    if declared in (None, AUTO) or (not where and float(declared) == MARGIN):
        fallback = paper()
    else:
        source = GIVEN if where.startswith("given") else FILE
        fallback = Margin(check_value(float(declared)), source, where or f"the ablation's margin = {declared:g}")
    return resolve(store, choice, recipe_hash, opts, fallback=fallback, level=level, recipe=recipe)
