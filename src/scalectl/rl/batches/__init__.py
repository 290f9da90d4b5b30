"""A training batch of scored groups: fetch, count, filter, refill (:mod:`.collect`), and the
prompt filters (:mod:`.filters`)."""
