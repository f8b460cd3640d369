"""Synthetic tasks with checkable answers, for rollouts and RL examples on a tiny model."""
