# Kernel caches, unpacked once per machine. MLX's cache for the end-to-end workload
# (mlx-cache: 42 mma.sync kernels, tools/cuda_offline.py cache --workloads e2e, then a partial run of --workloads tests); MLX keys
# each kernel on its rendered source, which holds only the headers that kernel includes, so
# a tree that changes only kernels/cuda/hopper/ (attn-order) finds them too. bi-rl's NVRTC
# cubins (nvrtc-main: every Hopper GEMM, qmm and wgmma attention variant, precompile_main.py)
# key on every kernel file, so they serve main's kernels digest (nvrtc-main.digest) alone:
# `caches.sh main` checks the checkout against it and copies them to /tmp/nvrtc-new;
# `caches.sh ao` and `caches.sh fp` unpack the branch archives' own NVRTC caches
# (nvrtc-ao.tgz: precompile_attn.py in branch-ao; nvrtc-fp.tgz: precompile_fp.py in branch-fp)
# to /tmp/nvrtc-ao and /tmp/nvrtc-fp.
D=$(cd "$(dirname "$0")" && pwd)
[ -d /tmp/mlx-new ] || { mkdir -p /tmp/mlx-new && cp -r $D/mlx-cache/. /tmp/mlx-new/; }
if [ "$1" = main ]; then
  [ -d /tmp/nvrtc-new ] || { tar xzf $D/nvrtc-main.tgz -C /tmp && mv /tmp/nvrtc-main /tmp/nvrtc-new; }
  have=$(cd $D/.. && PYTHONPATH=$D/.. python3 -c "from bi_rl.backends.cuda._kernels import files_digest; print(files_digest())" 2>/dev/null)
  want=$(cat $D/nvrtc-main.digest)
  [ "$have" = "$want" ] && echo "NVRTC cache for kernels $have" || echo "WARNING: NVRTC cache built for kernels $want, the checkout has $have: kernels compile on first use"
fi
for t in ao fp; do
  if [ "$1" = $t ] && [ ! -d /tmp/nvrtc-$t ] && [ -f $D/nvrtc-$t.tgz ]; then
    tar xzf $D/nvrtc-$t.tgz -C /tmp && echo "NVRTC cache for branch $t: $(ls /tmp/nvrtc-$t | wc -l) files"
  fi
done
