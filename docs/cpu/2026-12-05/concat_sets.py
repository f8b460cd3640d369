"""Host time of one concatenated sibling set (bi_rl.concat) per call, stock and in the mode
(CPU backend), in the checkout named on the command line (its tools/ and bi_rl/ are used):

    cd /tmp && python concat_sets.py CHECKOUT

Prints, in µs per call (tools/host_cost.py's per_call_us, one bf16 token): a 4-bit q/k/v set
and a bf16 gate/up set with each member its own product (stock), then concatenated, stock
and inside the mode.
"""

import sys


def main(root: str) -> None:
    sys.path[:0] = [root + "/tools", root]
    import mlx.core as mx
    import mlx.nn as nn
    from host_cost import per_call_us

    import bi_rl

    assert bi_rl.__file__.startswith(root), bi_rl.__file__
    from bi_rl.concat import concatenated
    from bi_rl.mode import named_mode

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.QuantizedLinear(2048, 2048, bias=False, group_size=64, bits=4)
            self.k_proj = nn.QuantizedLinear(2048, 1024, bias=False, group_size=64, bits=4)
            self.v_proj = nn.QuantizedLinear(2048, 1024, bias=False, group_size=64, bits=4)
            self.gate_proj = nn.Linear(2048, 6144, bias=False)
            self.up_proj = nn.Linear(2048, 6144, bias=False)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Block()]

    m = Model()
    m.set_dtype(mx.bfloat16)
    mx.eval(m.parameters())
    a = m.layers[0]
    x = mx.zeros((1, 1, 2048), mx.bfloat16)

    def qkv():
        return a.q_proj(x), a.k_proj(x), a.v_proj(x)

    def gu():
        return a.gate_proj(x), a.up_proj(x)

    res = [per_call_us(qkv), per_call_us(gu)]  # stock, each member its own product
    with concatenated(m) as n:
        assert n == 2, n
        res += [per_call_us(qkv), per_call_us(gu)]
        with named_mode("strict"):
            res += [per_call_us(qkv), per_call_us(gu)]
    print(
        f"{root:<11} separate, stock qkv {res[0]:.2f} gate/up {res[1]:.2f} | concatenated: "
        f"stock qkv {res[2]:.2f} gate/up {res[3]:.2f} | mode qkv {res[4]:.2f} gate/up {res[5]:.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
