"""Ranks in step: divergence between ranks, rank-local memory, determinism and run-to-run variance.

- :mod:`.sync`: ``check_in_sync`` (per-tensor checksums compared across ranks in one collective);
- :mod:`.memory`: per-rank peak memory and the imbalance rule;
- :mod:`.determinism`: ``determinism_report`` (seeds, deterministic algorithms, cuDNN, cuBLAS, samplers);
- :mod:`.fingerprint` / :mod:`.diff`: per-step run fingerprints and ``torchdoctor runs diff``.
"""
