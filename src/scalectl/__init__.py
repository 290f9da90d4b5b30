"""scalectl: orchestrate RL-for-LLM recipe ablations and fit their compute-scaling curves."""

__version__ = "0.1.0"
