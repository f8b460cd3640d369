"""The deeper pipeline (PREFILL_DEEP: loads STAGES - 1 stages ahead, a second barrier a stage)
against PREFILL and stock MLX, in one process, on the bf16 GEMM shapes of bi-bench past 64 rows,
timed as persist_ab.py times the persistent blocks (its docstring says how).

    PYTHONPATH=<tree> python3 -P docs/h200/2026-12-03/s25/deep_ab.py > deep.jsonl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from persist_ab import main  # noqa: E402

if __name__ == "__main__":
    main("deep", "PREFILL_DEEP")
