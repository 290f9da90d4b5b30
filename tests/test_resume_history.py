"""A run interrupted inside a step checkpoints the state as of the step before it: the
groups fetched so far in the broken step (already counted in the prompt history and the
compute meter, already drawn from the prompt sampler) are fetched again on resume, so the
checkpoint must not hold them, or the resumed run counts them twice and retires prompts
the uninterrupted run does not.

PPO-off-policy-2 makes the interruption deterministic: the step that generates a round
generates two batches, each counted as it is generated; a Ctrl-C that lands in the second
batch's generation leaves the first counted and not trained on.  The same rule covers a
dynamic-sampling refill round and the pipeline's consumed groups (the loop, not the
schedule, decides what an interrupted step's checkpoint holds)."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 4
CUT_STEP = 2        # a step that generates a round (steps 0, 2: k = 2 batches per round)


class Quiet:
    def start(self, total_steps, first_step): ...
    def eval(self, step, point): ...
    def log(self, message): ...
    def stop(self): ...
    def step(self, step, metrics): ...


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from scalectl.recipe.load import load
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy
    from scalectl.rl.data.arithmetic import make_splits

    root = tmp_path_factory.mktemp("resume-history")
    policy = save_policy(build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128),
                         build_tokenizer(), root / "policy")
    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "tiny-cpu.toml", [
        "async.mode=ppo_off_policy", "async.k=2", "batch.prompts_per_step=4", "batch.generations_per_prompt=2",
        "eval.every_steps=100", "eval.prompts=4", "eval.samples_per_prompt=1", "checkpoint.every_steps=1",
        "checkpoint.keep=10", f"model.path={policy}", f"budget.steps={STEPS}", "length.max_new_tokens=6",
        "filter.zero_variance=false", "filter.retire_solved=true", "filter.retire_rule=cumulative"])
    train, held = make_splits(12, 4, seed=0, difficulty=2)
    return root, recipe, train, held


def _train(setup, name: str, resume: bool = False, cut_at: int | None = None) -> bool:
    """Train run ``name``; with ``cut_at``, Ctrl-C lands in the second generation call of that step.
    Returns whether the run was interrupted."""
    from scalectl.rl.loop import prepare, train
    from scalectl.rl.schedule.modes import schedule_for

    root, recipe, train_problems, held = setup
    (root / name).mkdir(exist_ok=True)
    policy, state = prepare(recipe, root / name, len(train_problems), Quiet(), resume)
    generate, calls = policy.engine.generate, []

    def interrupted_generate(*args, **kwargs):
        if state.step == cut_at:
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
        return generate(*args, **kwargs)

    policy.engine.generate = interrupted_generate
    schedule = schedule_for(recipe.async_)
    source = schedule.batches(recipe, policy, state, train_problems)
    try:
        train(recipe, policy, state, source, schedule=schedule, run_dir=root / name, eval_problems=held,
              sink=lambda p: None, reporter=Quiet())
    except KeyboardInterrupt:
        return True
    return False


def _saved(setup, name: str, step: int) -> dict:
    return torch.load(setup[0] / name / "checkpoints" / f"step-{step:06d}" / "state.pt", weights_only=False)


def _counted(saved: dict) -> dict:
    """What a checkpoint holds of the groups fetched so far (wall seconds aside)."""
    meter = {k: v for k, v in saved["meter"].items() if k != "seconds"}
    return {"history": saved["history"], "sampler": saved["sampler"], "meter": meter,
            "pending": len(saved["pending"]), "step": saved["step"]}


def test_interrupted_step_checkpoints_the_state_before_it_and_resumes_to_the_same_history(setup):
    assert not _train(setup, "straight")
    assert _train(setup, "cut", cut_at=CUT_STEP)
    cut = _saved(setup, "cut", CUT_STEP)
    straight = _saved(setup, "straight", CUT_STEP)
    # the round of step 0 (2 batches of 4 prompts) only: not the broken step's first batch,
    # generated and counted before the Ctrl-C
    assert sum(len(h) for h in cut["history"]["history"].values()) == 2 * 4 * (CUT_STEP // 2)
    assert _counted(cut) == _counted(straight)

    assert not _train(setup, "cut", resume=True)
    final_cut, final_straight = _saved(setup, "cut", STEPS), _saved(setup, "straight", STEPS)
    assert _counted(final_cut) == _counted(final_straight)
    assert final_cut["history"]["retired"] == final_straight["history"]["retired"]
