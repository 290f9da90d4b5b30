"""Training: scored groups to a batch (:mod:`.batch`), advantages, policy losses, packing, the
DeepSpeed trainer, data-parallel ranks and their sharding, and the SFT warm start."""
