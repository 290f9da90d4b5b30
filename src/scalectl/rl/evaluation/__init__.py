"""Held-out evaluation: the pass rate (mean@k) and its companions (:mod:`.pass_rate`), and a
running loop's evaluations, in its thread or overlapped with training (:mod:`.during_training`)."""
