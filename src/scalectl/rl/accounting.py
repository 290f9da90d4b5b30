"""Compute accounting: GPU-hours (device-hours on CPU), FLOPs, tokens, samples.

* GPU-hours = devices held by the run x wall-clock hours spent generating and
  training (evaluation and checkpointing are measurement, not training
  compute, and are not counted).  On a CPU the same number is called
  device-hours; it is noisy on a shared machine, which is why the tiny setup
  fits on FLOPs.
* FLOPs, deterministic: 2N per token a forward pass processes while
  generating (prompt prefill and every generated token) and 6N per token
  trained (forward + backward over prompt and completion), N = parameters
  (Kaplan et al. 2020, arXiv 2001.08361, section 2.1).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass


@dataclass
class ComputeMeter:
    """Cumulative compute of a run; JSON-serialisable so checkpoints carry it.

    Attributes:
        devices: devices the run holds (generators + trainers).
        n_params: N in the FLOPs formula.
        seconds: wall-clock seconds of generation and training so far.
        flops: FLOPs so far.
        tokens: tokens generated so far (completions only).
        samples: completions generated so far.
    """

    devices: int
    n_params: int
    seconds: float = 0.0
    flops: float = 0.0
    tokens: int = 0
    samples: int = 0

    @property
    def gpu_hours(self) -> float:
        """devices x wall-clock hours."""
        return self.devices * self.seconds / 3600.0

    def add_generation(self, prompt_tokens: int, generated_tokens: int, completions: int) -> None:
        """Count a generation round: 2N FLOPs per processed token."""
        self.flops += 2.0 * self.n_params * (prompt_tokens + generated_tokens)
        self.tokens += int(generated_tokens)
        self.samples += int(completions)

    def add_training(self, trained_tokens: int) -> None:
        """Count one optimiser step's tokens (prompt + completion): 6N FLOPs each."""
        self.flops += 6.0 * self.n_params * trained_tokens

    def timer(self) -> "_Timer":
        """Context manager adding its wall-clock duration to :attr:`seconds`."""
        return _Timer(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ComputeMeter":
        return cls(**d)


class _Timer:
    def __init__(self, meter: ComputeMeter):
        self.meter = meter

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.meter.seconds += time.perf_counter() - self.t0
        return False
