"""Rescoring and audit: the second half of the bridge.

    scorer.py    full forward passes over logged samples -> float32 logprobs, fingerprints
    queued.py    a pass's decoder layers queued on the device as the host builds them
    report.py    logged vs rescored: bitwise mismatches and the k1 / k2 / k3 KL estimators
    audit.py     log integrity by hash, two logs compared, tokens re-derived with a model
    rescore.py   one bi-rescore run: the log's model, a different batch composition, a report
    policy.py    value-exact trainer logprobs: the invariant value, the stock gradient
    dataset.py   logs as datasets.Dataset (bi_rl.read_dataset); rewards keyed by record hash

The logits -> logprob / fingerprint step is bi_rl.logprobs, shared with the sampler.
"""
