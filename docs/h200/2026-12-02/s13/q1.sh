# Sibling quantized projections in one launch (hopper_qmm.grouped_quantized_matmul), on the
# GPU: its bit-for-bit tests against one launch a member (every bit width, group size, row
# tile edge and decode configuration; the plan and compile tests; the fusion tests, incl. a
# 4-bit rollout grouped by default against BI_RL_GROUP_PROJECTIONS=0), then the bare decode
# step A/B on the 1.7B shape in 4-bit (ab_qgroup.py). No kernel cache carried.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc MLX_PTX_CACHE_DIR=/tmp/mlx PYTHONPATH=$PWD
R=$OUT/q1; mkdir -p $R /tmp/nvrtc /tmp/mlx; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout ${T1:-150} python3 -m pytest -q -p no:cacheprovider -p xdist -n 8 tests/test_cuda_hopper.py::test_one_quantized_launch_over_sibling_weights_has_each_weights_own_bits tests/test_cuda_hopper.py::test_grouped_quantized_entry_compiles_clean tests/test_cuda_hopper.py::test_grouped_quantized_matmul_plans_one_launch tests/test_fusion.py > $R/tests.log 2>&1; echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -2 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head
s=$SECONDS; timeout ${T2:-100} python3 docs/h200/2026-12-02/s13/ab_qgroup.py > $R/ab-qgroup.txt 2>&1; echo "ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -v "^bi_rl:" $R/ab-qgroup.txt | tail -6
