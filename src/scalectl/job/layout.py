"""A run's layout on its devices, checked before anything is submitted.

The dry run (and ``scalectl run`` before it creates a run) refuses what the
job would refuse at start, or what would leave devices idle while billed:

* task counts that do not add up: a Slurm job of ``nodes x tasks_per_node``
  tasks must hold exactly ``hardware.generators + hardware.trainers`` tasks;
* generator or trainer counts the async mode cannot use: a step's prompts must
  split into whole groups across the trainers, and the mode says which
  generator counts it accepts
  (:meth:`scalectl.recipe.async_modes.AsyncMode.layout_problems`: in the modes
  that generate a round of batches with one policy version, a round's prompts
  across the generators, else some would sit idle; in ``pipeline``, the
  (k + 1) P prompts kept requested must be at least one per generator);
* GPUs per task: on CUDA every task needs a GPU of its own;
* a trainer whose parameters, gradients and optimiser states do not fit the
  device's memory at the chosen ZeRO stage (:func:`trainer_memory`), or a
  generator that cannot hold the weights;

It also describes the layout: the role of every task on every node
(:func:`role_map`) and the weight-sync plan (:mod:`scalectl.rl.transport.weight_sync`).
Pure functions on plain numbers and a :class:`scalectl.recipe.schema.Recipe`;
:func:`parameter_count` alone imports transformers (lazily).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scalectl.display import bytes_text, count_text
from scalectl.recipe.async_modes import async_mode
from scalectl.rl.transport.weight_sync import WeightSyncPlan, weight_sync_plan

#: Bytes per parameter of (weights, gradients, optimiser states) for AdamW.
#: bf16 is mixed precision: bf16 weights and gradients, and fp32 master weights,
#: momentum and variance (K = 12 in Rajbhandari et al. 2020, Sec. 3.1);
#: fp32 keeps fp32 weights and gradients and the two fp32 moments (K = 8).
ADAM_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8)}


@dataclass(frozen=True)
class Slot:
    """One task of a job: where it runs and what it does.

    Attributes:
        node: node index in the allocation (0-based).
        local_rank: task index on that node (its GPU).
        rank: global rank.
        role: ``generator`` or ``trainer``.
        role_rank: rank among the tasks of that role.
    """

    node: int
    local_rank: int
    rank: int
    role: str
    role_rank: int


def spread(tasks: int, nodes: int) -> list[int]:
    """Tasks per node when ``tasks`` are spread over ``nodes`` as evenly as they go, the first
    nodes taking one more: ``spread(5, 3) == [2, 2, 1]``."""
    return [tasks // nodes + (1 if i < tasks % nodes else 0) for i in range(nodes)]


def role_map(generators: int, trainers: int, tasks_per_node: int, *, generator_nodes: int = 0,
             trainer_nodes: int = 0) -> list[Slot]:
    """Every task's node and role; the first ``generators`` ranks generate, the rest train (as
    :func:`scalectl.rl.transport.roles.assign_role`).

    Shared nodes (``generator_nodes`` = 0): ranks fill node 0 first, ``tasks_per_node`` each.
    Placement by role (``generator_nodes`` and ``trainer_nodes`` > 0, the setup's
    ``launcher.slurm.generator_nodes``): nodes ``0 .. generator_nodes-1`` hold the generators,
    the next ``trainer_nodes`` the trainers, each role spread over its nodes by :func:`spread`
    (``tasks_per_node`` is then the most a node holds, not checked here).

    Raises:
        ValueError: a count below 1, or fewer tasks of a role than its nodes.
    """
    if generators < 1 or trainers < 1 or tasks_per_node < 1:
        raise ValueError("generators, trainers and tasks_per_node must be >= 1")
    if generator_nodes <= 0:
        return [Slot(rank // tasks_per_node, rank % tasks_per_node, rank, *_role(rank, generators))
                for rank in range(generators + trainers)]
    if trainer_nodes < 1 or generators < generator_nodes or trainers < trainer_nodes:
        raise ValueError("placement by role needs >= 1 node per role and >= 1 task per node")
    slots, rank = [], 0
    for first, counts in ((0, spread(generators, generator_nodes)), (generator_nodes, spread(trainers, trainer_nodes))):
        for i, count in enumerate(counts):
            for local in range(count):
                slots.append(Slot(first + i, local, rank, *_role(rank, generators)))
                rank += 1
    return slots


def _role(rank: int, generators: int) -> tuple[str, int]:
    return ("generator", rank) if rank < generators else ("trainer", rank - generators)


def _ranks(ranks) -> str:
    """``rank 0`` or ``ranks 0-3``."""
    ranks = list(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {_span(ranks)}"


def _span(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def role_map_lines(slots: list[Slot]) -> list[str]:
    """One line per node: ``node 8: ranks 64-71 -> trainers 0-7``."""
    lines = []
    for node in sorted({s.node for s in slots}):
        on = [s for s in slots if s.node == node]
        parts = []
        for role in ("generator", "trainer"):
            of = [s for s in on if s.role == role]
            if of:
                parts.append(f"{role}s {_span([s.role_rank for s in of])}")
        lines.append(f"node {node}: ranks {_span([s.rank for s in on])} -> {', '.join(parts)}")
    return lines


@dataclass(frozen=True)
class MemoryEstimate:
    """Model states held by one trainer (bytes), activations and buffers not included.

    Attributes:
        params: parameter count Psi.
        zero_stage: 0-3.
        trainers: data-parallel degree N_d.
        weights, gradients, optimizer: bytes of each on one trainer.
    """

    params: int
    zero_stage: int
    trainers: int
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """Bytes per trainer."""
        return self.weights + self.gradients + self.optimizer

    def line(self) -> str:
        """One line for the dry run."""
        return (f"trainer memory (ZeRO-{self.zero_stage}, {self.trainers} trainer(s), "
                f"{count_text(self.params)} parameters): {bytes_text(self.total)} per trainer = "
                f"weights {bytes_text(self.weights)} + gradients {bytes_text(self.gradients)} + "
                f"optimiser states {bytes_text(self.optimizer)} (activations not included)")



def trainer_memory(params: int, zero_stage: int, trainers: int, dtype: str = "bf16") -> MemoryEstimate:
    """Bytes of weights, gradients and AdamW states on each of ``trainers`` data-parallel ranks.

    ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
    Trillion Parameter Models", SC20, arXiv 1910.02054, Sec. 5.1 and Figure 1):
    with w, g, K bytes per parameter of weights, gradients and optimiser states
    (mixed-precision Adam: 2, 2, 12) and N_d data-parallel ranks, one rank holds

    - stage 0 (plain data parallel): (w + g + K) Psi
    - stage 1 (P_os, optimiser states partitioned): (w + g) Psi + K Psi / N_d
    - stage 2 (P_os+g, and gradients): w Psi + (g + K) Psi / N_d
    - stage 3 (P_os+g+p, and weights): (w + g + K) Psi / N_d

    e.g. Psi = 7.5e9, N_d = 64: 120, 31.4, 16.6 and 1.9 GB (the paper's Figure 1).

    Args:
        params: parameter count Psi.
        zero_stage: 0, 1, 2 or 3.
        trainers: N_d.
        dtype: the model dtype, ``bf16`` (mixed precision) or ``fp32`` (:data:`ADAM_BYTES`).

    Raises:
        ValueError: a stage outside 0-3, trainers < 1, unknown dtype.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
    if trainers < 1:
        raise ValueError(f"trainers must be >= 1, got {trainers}")
    if dtype not in ADAM_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(ADAM_BYTES)}")
    w, g, k = ADAM_BYTES[dtype]
    n = trainers
    return MemoryEstimate(
        params, zero_stage, trainers,
        weights=params * w / (n if zero_stage >= 3 else 1),
        gradients=params * g / (n if zero_stage >= 2 else 1),
        optimizer=params * k / (n if zero_stage >= 1 else 1),
    )


def parameter_count(model) -> int | None:
    """The policy's parameter count, or None when it cannot be known here.

    From the model's config without loading weights (transformers on the meta
    device): ``builtin:tiny``, or a checkpoint folder with a ``config.json``;
    otherwise the setup's ``model.params``.
    """
    path = model.path
    config_file = Path(path) / "config.json"
    if not path.startswith("builtin:") and not config_file.is_file():
        return int(model.params) if model.params is not None else None
    import torch

    with torch.device("meta"):
        if path.startswith("builtin:"):
            from scalectl.rl.policy.model import build_tiny_model

            net = build_tiny_model()
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            json.loads(config_file.read_text())       # a readable JSON file, or the error names it
            net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in net.parameters())


def _gpus_per_node(recipe, per_node: int, problems: list[str]) -> None:
    slurm = recipe.launcher.slurm
    if recipe.hardware.device == "cuda" and slurm.gpus_per_node < per_node:
        problems.append(f"hardware.device = cuda needs one GPU per process: launcher.slurm.gpus_per_node = "
                        f"{slurm.gpus_per_node} < {per_node} process(es) per node")


def _hosts(text: str | None, key: str, problems: list[str]) -> list[str] | None:
    """The hosts of a node list key (``launcher.slurm.generator_nodelist``), None when unset."""
    from scalectl.names import expand_hostlist

    if not text:
        return None
    try:
        return expand_hostlist(text)
    except ValueError as exc:
        problems.append(f"launcher.slurm.{key} = {text!r}: {exc}")
        return None


def _placed_by_role(recipe, single: bool, problems: list[str], lines: list[str]) -> None:
    """Checks and role map of a Slurm job whose generators and trainers have nodes of their own
    (``launcher.slurm.generator_nodes`` > 0)."""
    hw, slurm = recipe.hardware, recipe.launcher.slurm
    gens, trains, g = hw.generators, hw.trainers, slurm.generator_nodes
    t = slurm.nodes - g
    if single:
        problems.append(f"launcher.slurm.generator_nodes = {g}: async.mode = {recipe.async_.mode} with {gens} "
                        f"generator + {trains} trainer runs in one process, which has no roles to place (use 0)")
        return
    if t < 1 or gens < g or trains < t:
        problems.append(f"launcher.slurm.generator_nodes = {g} of nodes = {slurm.nodes} leaves {t} node(s) for "
                        f"hardware.trainers = {trains} and {g} for hardware.generators = {gens}: every node needs "
                        "a task of its role (at least 1 node per role, at most one node per task)")
        return
    most = max(spread(gens, g)[0], spread(trains, t)[0])
    if slurm.tasks_per_node != most:
        problems.append(f"launcher.slurm.tasks_per_node = {slurm.tasks_per_node}, but with generator_nodes = {g} the "
                        f"busiest node runs {most} task(s) ({gens} generator(s) on {g} node(s), {trains} trainer(s) "
                        f"on {t}): set tasks_per_node = {most} (sbatch --ntasks-per-node, what each node holds)")
    if "nodelist" in slurm.additional_parameters and (slurm.generator_nodelist or slurm.trainer_nodelist):
        problems.append("launcher.slurm.additional_parameters.nodelist and generator_nodelist/trainer_nodelist "
                        "both name nodes: use the role lists alone")
    named = {}
    for key, want in (("generator_nodelist", g), ("trainer_nodelist", t)):
        hosts = _hosts(getattr(slurm, key), key, problems)
        if hosts is not None and len(hosts) != want:
            problems.append(f"launcher.slurm.{key} = {getattr(slurm, key)!r} names {len(hosts)} host(s), but "
                            f"the role has {want} node(s)")
        named[key] = hosts
    if named["generator_nodelist"] and named["trainer_nodelist"] and \
            set(named["generator_nodelist"]) & set(named["trainer_nodelist"]):
        problems.append("launcher.slurm.generator_nodelist and trainer_nodelist share hosts: a node holds one role")
    _gpus_per_node(recipe, most, problems)
    lines.append(f"role map (one task per device; generators and trainers on separate nodes, "
                 f"launcher.slurm.generator_nodes = {g}):")
    lines += ["  " + line for line in role_map_lines(role_map(gens, trains, most, generator_nodes=g, trainer_nodes=t))]
    lines.append("  generator nodes: " + (", ".join(named["generator_nodelist"]) if named["generator_nodelist"]
                                          else f"the job's first {g} node(s) not named for the trainers")
                 + "; trainer nodes: " + (", ".join(named["trainer_nodelist"]) if named["trainer_nodelist"]
                                          else "the job's other nodes"))


@dataclass(frozen=True)
class LayoutReport:
    """What the dry run prints and what it refuses.

    Attributes:
        lines: role map, memory estimate and weight-sync plan, ready to print.
        problems: reasons the run cannot start (empty when it can).
        memory: the trainer estimate, when the parameter count is known.
        weight_sync: the plan, when the parameter count is known and there are generators.
    """

    lines: list[str]
    problems: list[str]
    memory: MemoryEstimate | None
    weight_sync: WeightSyncPlan | None


def check_layout(recipe, params: int | None, launcher: str | None = None) -> LayoutReport:
    """Check ``recipe``'s hardware, launcher and batch against each other.

    Args:
        recipe: a :class:`scalectl.recipe.schema.Recipe`.
        params: the policy's parameter count (:func:`parameter_count`), None if unknown
            (memory is then not checked).
        launcher: ``local`` or ``slurm`` (default: the recipe's ``launcher.type``).

    Returns:
        A :class:`LayoutReport`; each problem names the keys involved and what would work.
    """
    hw, mode = recipe.hardware, async_mode(recipe.async_)
    kind = launcher or recipe.launcher.type
    slurm = recipe.launcher.slurm
    gens, trains = hw.generators, hw.trainers
    problems: list[str] = []
    lines: list[str] = []

    single = not mode.in_processes(gens, trains)
    tasks = gens + trains
    if kind == "slurm" and slurm.generator_nodes > 0:
        _placed_by_role(recipe, single, problems, lines)
    elif kind == "slurm":
        job_tasks = slurm.nodes * slurm.tasks_per_node
        if single and job_tasks != 1:
            problems.append(f"async.mode = {mode.name} with {gens} generator + {trains} trainer runs in one "
                            f"process: launcher.slurm.nodes x tasks_per_node = {slurm.nodes} x {slurm.tasks_per_node} "
                            f"= {job_tasks} tasks would leave {job_tasks - 1} idle (use 1 x 1)")
        elif not single and job_tasks not in (1, tasks):
            problems.append(f"launcher.slurm.nodes x tasks_per_node = {slurm.nodes} x {slurm.tasks_per_node} "
                            f"= {job_tasks} tasks, but hardware.generators + trainers = {gens} + {trains} "
                            f"= {tasks} (one task per device)")
        if slurm.generator_nodelist or slurm.trainer_nodelist:
            problems.append("launcher.slurm.generator_nodelist and trainer_nodelist place the roles on nodes of "
                            "their own: set launcher.slurm.generator_nodes too")
        # one GPU per process: the tasks of a node, or every process spawned by a one-task job
        per_node = 1 if single else (tasks if job_tasks == 1 else slurm.tasks_per_node)
        _gpus_per_node(recipe, per_node, problems)
        if single or job_tasks == 1:
            lines.append("role map: one task on node 0" + (" (generates and trains)" if single else
                         f", spawning {gens} generator(s) and {trains} trainer(s)"))
        else:
            lines.append("role map (one task per device):")
            lines += ["  " + line for line in role_map_lines(role_map(gens, trains, slurm.tasks_per_node))]
    elif single:
        lines.append("role map: one process generates and trains")
    else:
        lines.append(f"role map (processes on this machine): {_ranks(range(gens))} generator(s), "
                     f"{_ranks(range(gens, tasks))} trainer(s)")

    prompts = recipe.batch.prompts_per_step
    if prompts % trains:
        problems.append(f"batch.prompts_per_step = {prompts} does not split into whole groups across "
                        f"hardware.trainers = {trains} (use a multiple of {trains})")
    problems += mode.layout_problems(gens, trains, prompts)

    memory = plan = None
    if params is None:
        lines.append("trainer memory: not estimated (set model.params, or point model.path at a "
                     "checkpoint folder with a config.json)")
    else:
        memory = trainer_memory(params, hw.zero_stage, trains, recipe.model.dtype)
        lines.append(memory.line())
        if hw.memory_gb is not None:
            cap = hw.memory_gb * 1e9
            if memory.total > cap:
                problems.append(f"a trainer needs {memory.total / 1e9:.1f} GB for parameters, gradients and "
                                f"optimiser states at hardware.zero_stage = {hw.zero_stage} with {trains} "
                                f"trainer(s), more than hardware.memory_gb = {hw.memory_gb:g} (raise "
                                "zero_stage or trainers)")
            weights = memory.params * ADAM_BYTES[recipe.model.dtype][0]
            if weights > cap:
                problems.append(f"a generator needs {weights / 1e9:.1f} GB for the weights alone, more than "
                                f"hardware.memory_gb = {hw.memory_gb:g}")
        else:
            lines.append("  (hardware.memory_gb not set: not compared with the device's memory)")
        plan = weight_sync_plan(params, recipe.model.dtype, gens)
        lines.append(plan.line())
    return LayoutReport(lines, problems, memory, plan)
