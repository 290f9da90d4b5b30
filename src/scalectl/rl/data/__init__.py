"""Prompt sets: files and hub data sets (:mod:`.files`), the synthetic arithmetic tasks
(:mod:`.arithmetic`), and the disjoint training and held-out splits of a run (:mod:`.splits`)."""
