# Long-context rescoring (bi-bench's rescore-long case: 4 x 8192 tokens, the last 64 of each
# scored) with the output head on the read rows alone against every position's logits, bf16
# and 4-bit, both arms in this process, alternating twice.
import sys

import bi_rl.score.scorer as S
from bi_rl.bench.e2e import long_rescore
from bi_rl.model import load_model

listed = S.ROW_HEAD_FAMILIES
for label in ("bf16", "q4"):
    model, _ = load_model(f"{sys.argv[1]}/{label}")
    for rnd in range(2):
        for arm, fam in (("all", frozenset()), ("rows", listed)):
            S.ROW_HEAD_FAMILIES = fam
            r = long_rescore(model, repeats=3)
            print(
                f"{label} round {rnd} {arm:4s}: off {r['seconds_off']:.4f} s, strict "
                f"{r['seconds_strict']:.4f} s, strict/off {r['strict_vs_off']:.3f}, gemm extra "
                f"{r['gemm_extra_s']:.4f}, attention extra {r['attention_extra_s']:.4f}, "
                f"spread {r['spread']:.2f}",
                flush=True,
            )
    S.ROW_HEAD_FAMILIES = listed
    del model
