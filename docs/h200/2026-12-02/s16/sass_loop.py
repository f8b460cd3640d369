# Static size of the main loop in `cuobjdump -sass` listings of the wgmma prefill attention:
# the backward branch spanning the most P V instructions (HGMMA.64x128x16) and, inside it,
# the instructions, register moves (MOV, IMAD.MOV.U32) and uniform-datapath ones. Static
# counts take every path of the loop body (masked softmax, split fold), so they compare
# variants of one kernel, not its executed stream (c/prefill-sass.csv.gz has that).
#     python3 docs/h200/2026-12-02/s16/sass_loop.py A-x2.sass B-x2.sass ...
import re
import sys

MOVE = re.compile(r"(@!?P\d )?(MOV|IMAD\.MOV\.U32) ")
UNIFORM = re.compile(r"(@!?U?P\d )?(R2UR|ULOP3|UMOV|UIADD3|USHF|UIMAD|ULEA|UISETP)")

for path in sys.argv[1:]:
    ins = []
    with open(path) as f:
        for line in f:
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2)))
    best = None
    for addr, txt in ins:
        m = re.search(r"BRA 0x([0-9a-f]+)", txt)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [t for a, t in ins if start <= a <= addr]
        pv = sum("HGMMA.64x128x16" in t for t in body)
        if pv and (best is None or (pv, -len(body)) > (best[0], -len(best[1]))):
            best = (pv, body, start, addr)
    if best is None:
        print(f"{path}: no loop with P V instructions")
        continue
    pv, body, start, end = best
    moves = sum(bool(MOVE.match(t)) for t in body)
    uniform = sum(bool(UNIFORM.match(t)) for t in body)
    print(
        f"{path}: loop {start:#x}-{end:#x}: {len(body)} instructions, P V HGMMA {pv}, "
        f"moves {moves}, uniform {uniform}"
    )
