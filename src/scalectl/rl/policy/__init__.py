"""The policy: the built-in tokenizer and model, loading checkpoints (:mod:`.model`), and the
one log-prob computation of trainer and rollout engines (:mod:`.logprobs`)."""
