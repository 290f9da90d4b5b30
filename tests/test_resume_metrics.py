"""A point re-made on resume carries the training metrics of the step before it, as the
uninterrupted run's point does: the last step's metrics are part of the checkpoint."""

from __future__ import annotations

import pytest

from conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class StopAfter:
    """A loop reporter that interrupts the run (as Ctrl-C would) once step ``n`` is logged,
    before that step's evaluation."""

    def __init__(self, n: int | None):
        self.n = n

    def start(self, total_steps, first_step): ...
    def eval(self, step, point): ...
    def log(self, message): ...
    def stop(self): ...

    def step(self, step, metrics):
        if step == self.n:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from scalectl.recipe.load import load
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy
    from scalectl.rl.data.arithmetic import make_splits

    root = tmp_path_factory.mktemp("resume-metrics")
    policy = save_policy(build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128),
                         build_tokenizer(), root / "policy")
    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "tiny-cpu.toml", [
        "async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4", "eval.every_steps=2",
        "eval.prompts=8", "eval.samples_per_prompt=2", "checkpoint.every_steps=100", f"model.path={policy}",
        "budget.steps=2", "length.max_new_tokens=8", "filter.zero_variance=false"])
    train, held = make_splits(64, 8, seed=0, difficulty=2)
    return root, recipe, train, held


def _run(setup, name: str, stop_at: int | None, resume: bool = False):
    from scalectl.job.body import StoreSink
    from scalectl.rl.run import run_training
    from scalectl.rl.schedule.modes import schedule_for
    from scalectl.store.database import Store

    root, recipe, train, held = setup
    store = Store.open(root / "s.db")
    run = store.get_run(name)["id"] if resume else store.create_run(name)
    try:
        run_training(recipe, root / name, schedule=schedule_for(recipe.async_),
                     sink=StoreSink(str(root / "s.db"), run), train_problems=train, eval_problems=held,
                     reporter=StopAfter(stop_at), resume=resume)
    except KeyboardInterrupt:
        pass
    points = {p["step"]: p for p in store.points(run)}
    store.close()
    return points


def test_point_remade_on_resume_keeps_the_training_metrics(setup):
    (setup[0] / "straight").mkdir()
    (setup[0] / "cut").mkdir()
    straight = _run(setup, "straight", None)
    cut = _run(setup, "cut", stop_at=2)
    assert sorted(cut) == [0]                       # interrupted after step 2, before its point
    cut = _run(setup, "cut", None, resume=True)
    assert sorted(cut) == sorted(straight) == [0, 2]
    assert straight[2]["train_reward"] is not None
    for key in ("train_reward", "entropy", "logprob_mismatch", "pass_rate", "tokens"):
        assert cut[2][key] == straight[2][key], key
