"""A run's layout on its devices, checked before anything is submitted.

The dry run (and ``scalectl run`` before it creates a run) refuses what the
job would refuse at start, or what would leave devices idle while billed:

* task counts that do not add up: a Slurm job of ``nodes x tasks_per_node``
  tasks must hold one task per GPU, ``hardware.generators x gpus_per_generator
  + trainers`` (a tensor-parallel generator's GPUs on one node);
* generator or trainer counts the async mode cannot use: a step's prompts must
  split into whole groups across the trainers, and the mode says which
  generator counts it accepts
  (:meth:`scalectl.recipe.async_modes.AsyncMode.layout_problems`: in the modes
  that generate a round of batches with one policy version, a round's prompts
  across the generators, else some would sit idle; in ``pipeline``, the
  (k + 1) P prompts kept requested must be at least one per generator);
* GPUs per task: on CUDA every task needs a GPU of its own;
* a trainer whose parameters, gradients and optimiser states, plus the activations
  of one micro-batch, do not fit the device's memory at the chosen ZeRO stage
  (:func:`trainer_memory`, :func:`scalectl.job.memory.activation_bytes`), or a
  vLLM generator whose KV cache cannot hold one step's share of completions at
  ``hardware.gpu_memory_utilization`` (:func:`scalectl.job.memory.generator_memory_plan`);
* a dedicated evaluation generator where there is no second generator.

It also describes the layout: the role of every task on every node
(:func:`role_map`), where evaluation samples, the memory plans and the weight-sync
plan (:mod:`scalectl.rl.transport.weight_sync`).  Pure functions on plain numbers and a
:class:`scalectl.recipe.schema.Recipe`; :func:`parameter_count` alone imports
transformers (lazily, for a checkpoint folder: the built-in tiny model is counted from its
config).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scalectl.display import bytes_text, count_text
from scalectl.job.memory import (Geometry, GeneratorMemoryPlan, activation_bytes, completions_in_flight,
                                 generator_memory_plan, head_bytes, step_share)
from scalectl.recipe.async_modes import async_mode
from scalectl.rl.transport.weight_sync import WeightSyncPlan, weight_sync_plan

#: Bytes per parameter of (weights, gradients, optimiser states) for AdamW.
#: bf16 is mixed precision: bf16 weights and gradients, and fp32 master weights,
#: momentum and variance (K = 12 in Rajbhandari et al. 2020, Sec. 3.1);
#: fp32 keeps fp32 weights and gradients and the two fp32 moments (K = 8).
ADAM_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8)}


@dataclass(frozen=True)
class Slot:
    """One task of a job (one GPU): where it runs and what it does.

    Attributes:
        node: node index in the allocation (0-based).
        local_rank: task index on that node (its GPU).
        rank: global rank.
        role: ``generator``, ``evaluator`` (a generator kept for held-out evaluation) or ``trainer``.
        role_rank: rank among the generators (the evaluator counts as the last) or the trainers;
            the ``gpus_per_generator`` tasks of one generator share it.
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


def role_map(generators: int, trainers: int, tasks_per_node: int, gpus_per_generator: int = 1,
             evaluator: bool = False, *, generator_nodes: int = 0, trainer_nodes: int = 0) -> list[Slot]:
    """Every task's node and role, one task per GPU; the first ``generators x gpus_per_generator``
    ranks are the generators' GPUs (generator g holds ranks g T .. g T + T - 1), the rest train
    (as :func:`scalectl.rl.transport.roles.assign_role`).

    Shared nodes (``generator_nodes`` = 0): ranks fill node 0 first, ``tasks_per_node`` each.
    Placement by role (``generator_nodes`` and ``trainer_nodes`` > 0, the setup's
    ``launcher.slurm.generator_nodes``): nodes ``0 .. generator_nodes-1`` hold the generators,
    the next ``trainer_nodes`` the trainers, each role spread over its nodes by :func:`spread`
    (``tasks_per_node`` is then the most a node holds, not checked here); one GPU per generator.

    Args:
        evaluator: the last generator is the dedicated evaluation generator.

    Raises:
        ValueError: a count below 1, or fewer tasks of a role than its nodes.
    """
    if min(generators, trainers, tasks_per_node, gpus_per_generator) < 1:
        raise ValueError("generators, trainers, tasks_per_node and gpus_per_generator must be >= 1")
    t = gpus_per_generator
    if generator_nodes <= 0:
        return [Slot(rank // tasks_per_node, rank % tasks_per_node, rank, *_role(rank, generators, t, evaluator))
                for rank in range(generators * t + trainers)]
    if t != 1:
        raise ValueError("placement by role takes one GPU per generator (gpus_per_generator = 1)")
    if trainer_nodes < 1 or generators < generator_nodes or trainers < trainer_nodes:
        raise ValueError("placement by role needs >= 1 node per role and >= 1 task per node")
    slots, rank = [], 0
    for first, counts in ((0, spread(generators, generator_nodes)), (generator_nodes, spread(trainers, trainer_nodes))):
        for i, count in enumerate(counts):
            for local in range(count):
                slots.append(Slot(first + i, local, rank, *_role(rank, generators, 1, evaluator)))
                rank += 1
    return slots


def _role(rank: int, generators: int, gpus_per_generator: int = 1, evaluator: bool = False) -> tuple[str, int]:
    """(role, role rank) of ``rank``: generator g holds ranks g T .. g T + T - 1 (T GPUs each),
    the last of them the evaluator with ``evaluator``; the ranks after them train."""
    t = gpus_per_generator
    if rank < generators * t:
        g = rank // t
        return ("evaluator" if evaluator and g == generators - 1 else "generator"), g
    return "trainer", rank - generators * t


def _ranks(ranks) -> str:
    """``rank 0`` or ``ranks 0-3``."""
    ranks = list(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {_span(ranks)}"


def _span(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def role_map_lines(slots: list[Slot], gpus_per_generator: int = 1) -> list[str]:
    """One line per node: ``node 8: ranks 64-71 -> trainers 0-7``; with tensor-parallel
    generators, ``node 0: ranks 0-7 -> generators 0-1 (4 GPUs each)``."""
    each = f" ({gpus_per_generator} GPUs each)" if gpus_per_generator > 1 else ""
    lines = []
    for node in sorted({s.node for s in slots}):
        on = [s for s in slots if s.node == node]
        parts = []
        for role, label in (("generator", "generators"), ("evaluator", "evaluation generator"),
                            ("trainer", "trainers")):
            of = sorted({s.role_rank for s in on if s.role == role})
            if of:
                parts.append(f"{label} {_span(of)}{each if role != 'trainer' else ''}")
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
    if path.startswith("builtin:"):                   # counted from its config: no torch to import
        from scalectl.rl.policy.tiny_config import TINY_CONFIG, TINY_VOCAB_SIZE, qwen2_parameter_count

        return qwen2_parameter_count({**TINY_CONFIG, "vocab_size": TINY_VOCAB_SIZE})
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    json.loads(config_file.read_text())               # a readable JSON file, or the error names it
    with torch.device("meta"):
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


def model_geometry(model) -> Geometry | None:
    """The architecture's :class:`~scalectl.job.memory.Geometry` (layers, KV heads, head dim,
    hidden size, vocabulary): from ``model.path``'s ``config.json`` (``builtin:tiny``: its
    config), else from ``model.config``; None when neither says (or says too little)."""
    path = model.path
    config_file = Path(path) / "config.json"
    if path.startswith("builtin:"):
        from scalectl.rl.policy.tiny_config import TINY_CONFIG, TINY_VOCAB_SIZE

        config = {**TINY_CONFIG, "vocab_size": TINY_VOCAB_SIZE}
    elif config_file.is_file():
        config = json.loads(config_file.read_text())
    else:
        config = dict(model.config)
    try:
        return Geometry.from_config(config) if config else None
    except (KeyError, TypeError, ZeroDivisionError):
        return None


@dataclass(frozen=True)
class TrainerActivations:
    """A trainer's activations for one micro-batch (bytes), beside its ZeRO states.

    Attributes:
        layers: the transformer layers' (:func:`scalectl.job.memory.activation_bytes`).
        head: the LM head's logits (:func:`scalectl.job.memory.head_bytes`).
        without_checkpointing, with_checkpointing: ``layers`` either way, for the line.
        checkpointing: ``hardware.gradient_checkpointing``.
        tokens: the micro-batch's tokens (micro_batch_size x the longest sequence).
    """

    layers: float
    head: float
    without_checkpointing: float
    with_checkpointing: float
    checkpointing: bool
    tokens: int

    @property
    def total(self) -> float:
        return self.layers + self.head

    def line(self, states: float) -> str:
        other = self.without_checkpointing if self.checkpointing else self.with_checkpointing
        return (f"trainer activations (micro-batch of {self.tokens:,} tokens, gradient checkpointing "
                f"{'on' if self.checkpointing else 'off'}): {bytes_text(self.layers)} + LM head "
                f"{bytes_text(self.head)} ({'off' if self.checkpointing else 'on'}: {bytes_text(other)} "
                f"+ {bytes_text(self.head)}); with the ZeRO states {bytes_text(states + self.total)} per trainer")


def trainer_activations(recipe, geometry: Geometry) -> TrainerActivations:
    """The activations of ``recipe``'s trainer micro-batch: ``batch.micro_batch_size``
    sequences of ``length.max_prompt_tokens + length.max_new_tokens`` tokens."""
    longest = recipe.length.max_prompt_tokens + recipe.length.max_new_tokens
    mb = recipe.batch.micro_batch_size
    kw = dict(micro_batch=mb, seq_len=longest, hidden=geometry.hidden, layers=geometry.layers,
              dtype_bytes=ADAM_BYTES[recipe.model.dtype][0])
    off, on = activation_bytes(checkpointing=False, **kw), activation_bytes(checkpointing=True, **kw)
    ckpt = recipe.hardware.gradient_checkpointing
    return TrainerActivations(on if ckpt else off, head_bytes(mb, longest, max(geometry.vocab, 1)), off, on, ckpt,
                              mb * longest)


def generator_plan(recipe, params: int, geometry: Geometry) -> GeneratorMemoryPlan:
    """The memory plan of one of ``recipe``'s training generators (vLLM): weights and the KV cache
    of the completions it decodes at once against ``hardware.gpu_memory_utilization`` x
    ``hardware.memory_gb`` (:func:`scalectl.job.memory.generator_memory_plan`)."""
    hw, mode = recipe.hardware, async_mode(recipe.async_)
    gens = training_generators(recipe)
    P, G = recipe.batch.prompts_per_step, recipe.batch.generations_per_prompt
    return generator_memory_plan(
        params=params, geometry=geometry, dtype=recipe.model.dtype, memory_gb=hw.memory_gb,
        utilization=hw.gpu_memory_utilization, tensor_parallel=hw.gpus_per_generator,
        longest=recipe.length.max_prompt_tokens + recipe.length.max_new_tokens,
        in_flight=completions_in_flight(mode.name, mode.k, P, G, gens), step_share=step_share(P, G, gens),
        max_num_seqs=hw.max_num_seqs)


def training_generators(recipe) -> int:
    """Generators that sample training rollouts: all of them, but the last when it is kept for
    evaluation (``hardware.evaluation = dedicated`` in a run in processes)."""
    hw = recipe.hardware
    in_processes = async_mode(recipe.async_).in_processes(hw.generators, hw.trainers)
    return hw.generators - (hw.evaluation_place(in_processes) == "dedicated")


@dataclass(frozen=True)
class LayoutReport:
    """What the dry run prints and what it refuses.

    Attributes:
        lines: role map, memory estimates and weight-sync plan, ready to print.
        problems: reasons the run cannot start (empty when it can).
        memory: the trainer's ZeRO states, when the parameter count is known.
        weight_sync: the plan, when the parameter count is known and there are generators.
        activations: the trainer's activations, when the architecture is known.
        generators: a vLLM generator's memory plan, when the architecture and ``hardware.memory_gb`` are known.
    """

    lines: list[str]
    problems: list[str]
    memory: MemoryEstimate | None
    weight_sync: WeightSyncPlan | None
    activations: TrainerActivations | None = None
    generators: GeneratorMemoryPlan | None = None


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
    lines, problems = _placement(recipe, kind)
    prompts = recipe.batch.prompts_per_step
    if prompts % hw.trainers:
        problems.append(f"batch.prompts_per_step = {prompts} does not split into whole groups across "
                        f"hardware.trainers = {hw.trainers} (use a multiple of {hw.trainers})")
    problems += mode.layout_problems(training_generators(recipe), hw.trainers, prompts)
    problems += _evaluation(recipe, lines)
    memory = plan = activations = generators = None
    if params is None:
        lines.append("trainer memory: not estimated (set model.params, or point model.path at a "
                     "checkpoint folder with a config.json)")
        return LayoutReport(lines, problems, None, None)
    geometry = model_geometry(recipe.model)
    memory = trainer_memory(params, hw.zero_stage, hw.trainers, recipe.model.dtype)
    lines.append(memory.line() if geometry is None else memory.line().replace(" (activations not included)", ""))
    if geometry is not None:
        activations = trainer_activations(recipe, geometry)
        lines.append(activations.line(memory.total))
    if hw.memory_gb is None:
        lines.append("  (hardware.memory_gb not set: not compared with the device's memory)")
    else:
        problems += _trainer_fits(recipe, memory, activations)
        if hw.rollout_engine == "vllm" and geometry is not None:
            generators = generator_plan(recipe, params, geometry)
            lines.append(generators.line())
            problems += _generators_fit(recipe, generators)
        else:
            weights = params * ADAM_BYTES[recipe.model.dtype][0] / hw.gpus_per_generator
            if geometry is None:
                lines.append("generator memory: KV cache not estimated (point model.path at a checkpoint "
                             "folder with a config.json, or set model.config)")
            if weights > hw.memory_gb * 1e9:
                problems.append(f"a generator needs {weights / 1e9:.1f} GB for the weights alone, more than "
                                f"hardware.memory_gb = {hw.memory_gb:g}")
    plan = weight_sync_plan(params, recipe.model.dtype, hw.generators)
    if mode.in_processes(hw.generators, hw.trainers):
        lines.append(plan.line())
    else:
        lines.append("weight sync: none (one process generates and trains: the engine reads the trained "
                     "weights in place, no broadcast)")
    return LayoutReport(lines, problems, memory, plan, activations, generators)


def _placement(recipe, kind: str) -> tuple[list[str], list[str]]:
    """The role map, and what keeps the tasks from matching the devices: one task per GPU in a
    Slurm job (a generator's GPUs on one node), a GPU for every process."""
    hw, mode, slurm = recipe.hardware, async_mode(recipe.async_), recipe.launcher.slurm
    gens, trains, t = hw.generators, hw.trainers, hw.gpus_per_generator
    lines: list[str] = []
    problems: list[str] = []
    single = not mode.in_processes(gens, trains)
    gpus = gens * t + trains
    evaluator = hw.evaluation_place(not single) == "dedicated"
    counted = (f"hardware.generators + trainers = {gens} + {trains} = {gpus}" if t == 1 else
               f"hardware.generators x gpus_per_generator + trainers = {gens} x {t} + {trains} = {gpus}")
    if kind != "slurm":
        if single:
            lines.append("role map: one process generates and trains")
        else:
            lines.append(f"role map (processes on this machine): {_ranks(range(gens))} generator(s)"
                         + (f" of {t} GPUs each" if t > 1 else "") + f", {_ranks(range(gens, gens + trains))} "
                         f"trainer(s)" + (f"; generator {gens - 1} evaluates" if evaluator else ""))
        return lines, problems
    if slurm.generator_nodes > 0:
        if t > 1:
            problems.append(f"launcher.slurm.generator_nodes = {slurm.generator_nodes} places one GPU per generator: "
                            f"hardware.gpus_per_generator = {t} needs generator_nodes = 0")
        else:
            _placed_by_role(recipe, single, problems, lines)
        return lines, problems
    if slurm.generator_nodelist or slurm.trainer_nodelist:
        problems.append("launcher.slurm.generator_nodelist and trainer_nodelist place the roles on nodes of "
                        "their own: set launcher.slurm.generator_nodes too")
    job_tasks = slurm.nodes * slurm.tasks_per_node
    if single and job_tasks != 1:
        problems.append(f"async.mode = {mode.name} with {gens} generator + {trains} trainer runs in one "
                        f"process: launcher.slurm.nodes x tasks_per_node = {slurm.nodes} x {slurm.tasks_per_node} "
                        f"= {job_tasks} tasks would leave {job_tasks - 1} idle (use 1 x 1)")
    elif not single and job_tasks not in (1, gpus):
        problems.append(f"launcher.slurm.nodes x tasks_per_node = {slurm.nodes} x {slurm.tasks_per_node} "
                        f"= {job_tasks} tasks, but {counted} (one task per {'device' if t == 1 else 'GPU'})")
    if not single and job_tasks > 1 and slurm.tasks_per_node % t:
        problems.append(f"launcher.slurm.tasks_per_node = {slurm.tasks_per_node} is not a multiple of "
                        f"hardware.gpus_per_generator = {t}: a generator's GPUs must be on one node")
    # one GPU per task: the tasks of a node, or every GPU of the processes a one-task job spawns
    per_node = 1 if single else (gpus if job_tasks == 1 else slurm.tasks_per_node)
    if hw.device == "cuda" and slurm.gpus_per_node < per_node:
        problems.append(f"hardware.device = cuda needs one GPU per {'process' if t == 1 else 'task'}: "
                        f"launcher.slurm.gpus_per_node = {slurm.gpus_per_node} < {per_node} "
                        f"{'process(es)' if t == 1 else 'GPU(s)'} per node")
    if single or job_tasks == 1:
        lines.append("role map: one task on node 0" + (" (generates and trains)" if single else
                     f", spawning {gens} generator(s) and {trains} trainer(s)"))
    else:
        lines.append("role map (one task per GPU):" if t > 1 else "role map (one task per device):")
        lines += ["  " + line for line in role_map_lines(role_map(gens, trains, slurm.tasks_per_node, t, evaluator), t)]
    return lines, problems


def _evaluation(recipe, lines: list[str]) -> list[str]:
    """The evaluation's line (where it samples), and why it cannot sample there."""
    hw = recipe.hardware
    in_processes = async_mode(recipe.async_).in_processes(hw.generators, hw.trainers)
    place = hw.evaluation_place(in_processes)
    n, k = recipe.eval.prompts, recipe.eval.samples_per_prompt
    where = {"trainer": "on the first trainer rank" + (" (its own engine)" if in_processes else ""),
             "generators": f"on the {training_generators(recipe)} generator(s), each a share",
             "dedicated": f"on generator {hw.generators - 1} alone (it samples no training rollouts)"}[place]
    lines.append(f"evaluation: {n} held-out prompt(s) x {k} {where}, from the weights of the point's version")
    if hw.evaluation == "dedicated" and (not in_processes or hw.generators < 2):
        return [f"hardware.evaluation = dedicated keeps the last generator for evaluation: it needs a run in "
                f"processes with hardware.generators >= 2 (have {hw.generators} generator(s), async.mode = "
                f"{recipe.async_.mode})"]
    return []


def _trainer_fits(recipe, memory: MemoryEstimate, activations: TrainerActivations | None) -> list[str]:
    hw = recipe.hardware
    cap = hw.memory_gb * 1e9
    if memory.total > cap:
        return [f"a trainer needs {memory.total / 1e9:.1f} GB for parameters, gradients and optimiser states "
                f"at hardware.zero_stage = {hw.zero_stage} with {hw.trainers} trainer(s), more than "
                f"hardware.memory_gb = {hw.memory_gb:g} (raise zero_stage or trainers)"]
    if activations is not None and memory.total + activations.total > cap:
        fix = ("lower batch.micro_batch_size" if hw.gradient_checkpointing else
               "set hardware.gradient_checkpointing = true or lower batch.micro_batch_size")
        return [f"a trainer needs {(memory.total + activations.total) / 1e9:.1f} GB: {memory.total / 1e9:.1f} GB "
                f"of ZeRO states and {activations.total / 1e9:.1f} GB of activations for batch.micro_batch_size = "
                f"{recipe.batch.micro_batch_size} sequences of up to {activations.tokens // recipe.batch.micro_batch_size:,} "
                f"tokens, more than hardware.memory_gb = {hw.memory_gb:g} ({fix})"]
    return []


def _generators_fit(recipe, plan: GeneratorMemoryPlan) -> list[str]:
    hw = recipe.hardware
    if plan.kv_budget <= 0:
        return [f"a generator GPU holds {plan.weights / 1e9:.1f} GB of weights, more than "
                f"hardware.gpu_memory_utilization x memory_gb = {hw.gpu_memory_utilization:g} x {hw.memory_gb:g} "
                f"= {plan.utilization * plan.gpu_bytes / 1e9:.1f} GB (raise gpu_memory_utilization or "
                "gpus_per_generator)"]
    if not plan.fits_step:
        need = plan.step_share * plan.longest * plan.kv_per_token
        return [f"a generator's KV cache holds {plan.tokens:,} tokens ({plan.kv_budget / 1e9:.1f} GB at "
                f"hardware.gpu_memory_utilization = {hw.gpu_memory_utilization:g}), {plan.concurrent} "
                f"completion(s) of {plan.longest:,} tokens, but one step's share is {plan.step_share} "
                f"({need / 1e9:.1f} GB): raise gpu_memory_utilization, gpus_per_generator or generators"]
    return []
