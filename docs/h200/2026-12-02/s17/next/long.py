# Long-context rescoring (bi-bench's rescore-long case: 4 x 8192 tokens, the last 64 of each
# scored) on the 1.7B-shaped models under argv[1], bf16 and 4-bit, with the bi_rl this process
# imports.
import sys

import bi_rl
from bi_rl.bench.e2e import long_rescore
from bi_rl.model import load_model

print(bi_rl.__file__, flush=True)
for label in ("bf16", "q4"):
    model, _ = load_model(f"{sys.argv[1]}/{label}")
    r = long_rescore(model, repeats=3)
    print(
        f"{label}: off {r['seconds_off']:.4f} s, strict {r['seconds_strict']:.4f} s, "
        f"strict/off {r['strict_vs_off']:.3f}, gemm extra {r['gemm_extra_s']:.4f}, "
        f"attention extra {r['attention_extra_s']:.4f}, spread {r['spread']:.2f}",
        flush=True,
    )
    del model
