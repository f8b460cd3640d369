"""Training on rollouts, on-policy to the bit: LoRA / full GRPO and PPO-style updates.

grpo.py      one rollout batch: the on-policy gate, group-relative advantages, clipped
             updates with value-exact logprobs (bi_rl.score.policy)
lora.py      LoRA adapters from mlx-lm's tuner, seeded; saved in mlx-lm's format
rewards.py   reward functions: the addition task's, or a user's module:function
loop.py      bi-train's loop: generated or logged batches, checkpoints, resume
"""
