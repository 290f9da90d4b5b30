"""The two ends of the weights' flow in a generator (the CPU engine's and a vLLM engine's) share
one declared interface, checked here without vLLM: a method changed on one side alone fails."""

import inspect

import pytest

from scalectl.rl.rollout.base import RolloutEngine
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.vllm import VLLMRolloutEngine
from scalectl.rl.transport.slot import BaseWeightSlot
from scalectl.rl.transport.stream import WeightSlot
from scalectl.rl.transport.vllm_worker import WorkerWeightSlot

SLOTS = [WeightSlot, WorkerWeightSlot]


def _members(cls) -> dict:
    """The public methods and properties ``cls`` declares (its own and inherited)."""
    return {name: value for name, value in inspect.getmembers(cls)
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


@pytest.mark.parametrize("slot", SLOTS, ids=lambda c: c.__name__)
def test_both_slots_implement_the_declared_interface(slot):
    assert issubclass(slot, BaseWeightSlot)
    assert not slot.__abstractmethods__           # nothing left abstract: the class can be built
    declared = _members(BaseWeightSlot)
    assert {"poll", "drain", "release", "awaiting", "stats"} <= set(declared)
    own = _members(slot)
    for name, value in declared.items():
        impl = own[name]
        if isinstance(value, property):
            assert isinstance(impl, property), name
            continue
        # the same parameters, in the same order, with the same kinds and defaults
        expected = [(p.name, p.kind, p.default) for p in inspect.signature(value).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(impl).parameters.values()]
        assert got == expected, f"{slot.__name__}.{name}{inspect.signature(impl)} != {inspect.signature(value)}"


def test_a_slot_that_drops_an_argument_is_caught():
    """The check above fails on the kind of drift it exists for: a ``drain`` (or ``poll``) without
    the ``check`` argument the generator's body passes."""

    class Drifted(WorkerWeightSlot):
        def poll(self, wait: bool = False) -> bool:   # the shape the vLLM slot once had
            return False

    with pytest.raises(AssertionError, match="poll"):
        test_both_slots_implement_the_declared_interface(Drifted)


def test_every_body_call_of_a_slot_is_declared():
    """What the generator's body and its evaluations call on a slot is declared by the base."""
    import re

    from scalectl.rl.processes import bodies, evaluations

    called = set()
    for module in (bodies, evaluations):
        called |= set(re.findall(r"\bslot\.(\w+)", inspect.getsource(module)))
    assert called, "no slot call found: the pattern no longer matches the bodies' code"
    declared = set(_members(BaseWeightSlot)) | set(BaseWeightSlot.__annotations__)
    assert called <= declared, called - declared


@pytest.mark.parametrize("engine", [CPURolloutEngine, VLLMRolloutEngine], ids=lambda c: c.__name__)
def test_both_engines_implement_the_rollout_interface(engine):
    assert issubclass(engine, RolloutEngine) and not engine.__abstractmethods__
    for name in ("generate", "update_weights"):
        expected = [(p.name, p.kind) for p in inspect.signature(getattr(RolloutEngine, name)).parameters.values()]
        got = [(p.name, p.kind) for p in inspect.signature(getattr(engine, name)).parameters.values()]
        assert got == expected, f"{engine.__name__}.{name}"
    assert "poll_weights" in inspect.signature(engine.__init__).parameters
