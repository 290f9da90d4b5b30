"""Runs in processes: what each generator and trainer process runs (:mod:`.bodies`), spawning and
supervising them on one machine (:mod:`.supervise`), and their torch threads (:mod:`.threads`)."""
