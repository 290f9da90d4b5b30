"""Async modes as schedules (:mod:`.modes`), and the trainer's end of the rollout stream in
processes (:mod:`.feeder`)."""
