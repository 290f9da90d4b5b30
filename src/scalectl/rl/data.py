"""Prompt sets for a run: the training split and the disjoint held-out split.

``data.source`` selects the loader:

* ``synthetic:arithmetic``: generated from ``data.seed`` at ``data.difficulty``
  (:mod:`scalectl.rl.tasks`); ``data.train_size`` prompts (default
  :data:`DEFAULT_SYNTHETIC_TRAIN`) and ``eval.prompts`` held-out prompts.
"""

from __future__ import annotations

from scalectl.errors import UserError

DEFAULT_SYNTHETIC_TRAIN = 4000


def load_prompt_sets(recipe) -> tuple[list, list]:
    """(train, held-out) problems for ``recipe`` (objects with ``id``, ``prompt``, ``answer``).

    Raises:
        UserError: an unknown ``data.source``.
    """
    source = recipe.data.source
    if source == "synthetic:arithmetic":
        from scalectl.rl.tasks import make_splits

        return make_splits(recipe.data.train_size or DEFAULT_SYNTHETIC_TRAIN, recipe.eval.prompts,
                           seed=recipe.data.seed, difficulty=recipe.data.difficulty)
    raise UserError(f"data.source = {source!r} is not one of: synthetic:arithmetic")
