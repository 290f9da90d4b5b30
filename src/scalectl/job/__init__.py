"""A training job: its body, what every launcher runs (:mod:`.body`), the run folder's lock
(:mod:`.lock`), the metrics trackers (:mod:`.trackers`), and its layout on devices (:mod:`.layout`)."""
