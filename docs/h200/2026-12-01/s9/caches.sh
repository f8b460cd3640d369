# The kernel caches carried for narrow-pipe's tree, unpacked once per machine (the NVRTC cache
# and MLX's kernel cache both key on every kernel file, so they serve that tree alone; the
# stamp file names the tree's kernels digest they were built for).
if [ ! -d /tmp/mlx-ptx ]; then mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-np.tgz -C /tmp && cp -r /tmp/mlx-cache-np/. /tmp/mlx-ptx/; fi
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-np /tmp/nvrtc-cache
B=$PWD/.devrun/branch-np
have=$(cd $B && PYTHONPATH=$B python3 -c "from bi_rl.backends.cuda._kernels import files_digest; print(files_digest())" 2>/dev/null)
want=$(cat .devrun/caches-digest.txt 2>/dev/null)
[ "$have" = "$want" ] || echo "WARNING: caches built for kernels $want, branch has $have: kernels compile on first use"
