"""The RL trainer: rollouts, rewards, advantages, policy losses, prompt filters and length control."""
