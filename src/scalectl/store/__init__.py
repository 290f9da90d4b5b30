"""The store: one SQLite file of runs, evaluation points, fits and ablations (:mod:`.database`), and
points imported from elsewhere (:mod:`.importer`)."""
