# The kernel caches carried for one tree, unpacked once per machine: `caches.sh main` (the
# checkout: NVRTC cubins nvrtc-np and MLX's kernel cache mlx-cache-np.tgz, built for kernels
# digest caches-digest.txt) or `caches.sh ts` (the tile-share archive branch-ts: NVRTC cubins
# nvrtc-ts for its Hopper GEMM kernels, digest nvrtc-ts.digest). Both caches key on every
# kernel file, so they serve their tree alone; a mismatch is reported and the kernels then
# compile on first use.
D=$(cd "$(dirname "$0")" && pwd)
case "$1" in
main)
  if [ ! -d /tmp/mlx-ptx ]; then mkdir -p /tmp/mlx-ptx && tar xzf $D/mlx-cache-np.tgz -C /tmp && cp -r /tmp/mlx-cache-np/. /tmp/mlx-ptx/; fi
  [ -d /tmp/nvrtc-cache ] || cp -r $D/nvrtc-np /tmp/nvrtc-cache
  T=$D/..; want=$(cat $D/caches-digest.txt) ;;
ts)
  [ -d /tmp/nvrtc-ts ] || cp -r $D/nvrtc-ts /tmp/nvrtc-ts
  T=$D/branch-ts; want=$(cat $D/nvrtc-ts.digest) ;;
*) echo "usage: caches.sh main|ts" >&2; exit 2 ;;
esac
have=$(cd $T && PYTHONPATH=$T python3 -c "from bi_rl.backends.cuda._kernels import files_digest; print(files_digest())" 2>/dev/null)
[ "$have" = "$want" ] && echo "caches for $1: kernels $have" || echo "WARNING: caches built for kernels $want, $1 has $have: kernels compile on first use"
