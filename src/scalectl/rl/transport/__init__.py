"""Between processes: who is who (:mod:`.roles`, :mod:`.board`), the rollout stream
(:mod:`.stream`), and the weights from trainers to generators (:mod:`.weight_sync`, :mod:`.broadcast`)."""
