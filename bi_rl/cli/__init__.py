"""Console entry points, one module per job: rollout, rescore, audit, verify, bench."""
