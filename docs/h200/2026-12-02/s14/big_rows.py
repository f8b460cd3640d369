# Past 2^31 output elements: the mode's GEMM (bf16) and quantized matmul (4-bit, group 64)
# against the 1.7B shape's head (N = 151936) at R rows, and the scorer's log-softmax and
# fingerprint ops over the (R, N) logits: the last 64 rows of each must be bit for bit the
# rows computed alone (stock MLX's quantized matmul fails to launch from 14135 rows here, run f3).
import mlx.core as mx

from bi_rl.logprobs import row_fingerprints, scaled_logits, scaled_token_logprobs
from bi_rl.mode import named_mode
from bi_rl.verify.core import bits

N, K = 151936, 2048
w = (mx.random.normal((N, K)) * K**-0.5).astype(mx.bfloat16)
wq, s, b = mx.quantize(w, group_size=64, bits=4)
mx.eval(w, wq, s, b)


def head(x, quant):
    if quant:
        return mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
    return x @ w.T


def rows_ops(logits, targets):
    x = scaled_logits(logits, 1.0)
    return [logits, scaled_token_logprobs(x, targets), row_fingerprints(logits)]


with named_mode("strict"):
    for quant in (False, True):
        for r in (14135, 16384, 28672):
            x = mx.random.normal((r, K)).astype(mx.bfloat16)
            t = mx.random.randint(0, N, (r,))
            full = rows_ops(head(x, quant), t)
            mx.eval(full)
            tail = [bits(a[-64:]) for a in full]
            del full
            alone = rows_ops(head(x[-64:], quant), t[-64:])
            same = [bool((bits(a) == f).all()) for a, f in zip(alone, tail, strict=True)]
            name = "4-bit" if quant else "bf16"
            print(f"{name} R={r}: logits/logprobs/fingerprints same as alone: {same}", flush=True)
