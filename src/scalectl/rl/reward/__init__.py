"""Rewards: the answer checker and the +-1 reward of a completion (:mod:`.checker`)."""
