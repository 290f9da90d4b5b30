"""The science of stored runs: their fits (:mod:`.fits`), verdicts against the margin
(:mod:`.compare`), and extrapolation checks (:mod:`.extrapolate`)."""
