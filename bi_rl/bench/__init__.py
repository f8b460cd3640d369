"""bi-bench: the invariant path and stock MLX timed side by side on the active backend."""
