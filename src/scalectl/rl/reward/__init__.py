"""Rewards: the recipe's reward per completion (:mod:`.scoring`), the built-in answer checker
and its +-1 reward (:mod:`.checker`), answer formats (:mod:`.formats`) and reward functions
of the user's in worker processes (:mod:`.calls`, :mod:`.score`)."""
