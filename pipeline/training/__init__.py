"""Stage 2, training: the Ray Train workers, their step, state and checkpoints."""
