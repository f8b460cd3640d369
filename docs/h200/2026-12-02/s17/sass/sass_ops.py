"""Opcode-level view of sm_90 cubins without a disassembler on this machine.

The SASS of an sm_90 instruction is 16 bytes; its low 12 bits name the opcode. `learn` reads
`cuobjdump -sass` listings made on the device (each instruction with its encoding) and writes
the opcode -> mnemonic table opdb.json beside this file; `stats` then decodes cubins built here
(bi-rl's NVRTC path) with that table and prints, for each kernel, the static counts of the
whole kernel and of its main loop (the backward branch spanning the most P V instructions,
HGMMA with a register A operand, as docs/h200/2026-12-02/s16/sass_loop.py finds it in a
listing); `list` prints the mnemonics of an address range with runs compressed and the
branch targets decoded. Checked against this session's listings: the main loop of main's bf16
head-dim-128 causal kernel spans the same addresses and 1641 / 2102 instructions (two / one
warpgroups) as sass_loop.py finds in the listing; moves read 246 against its 250 (here an IMAD
is a move when both multiplicands are RZ, there when the listing says IMAD.MOV.U32).

    python3 sass_ops.py learn A-x1.sass A-x2.sass ...
    python3 sass_ops.py stats attn.cubin ...
    python3 sass_ops.py list attn.cubin 0x86a0 0x11de0
"""

from __future__ import annotations

import collections
import json
import re
import struct
import sys
from pathlib import Path

# the ELF reading is tools/cuda_offline.py's (which imports bi_rl from the repository root)
ROOT = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from cuda_offline import elf_section_headers  # noqa: E402

DB = Path(__file__).with_name("opdb.json")
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/")
PV = "HGMMA.RS"  # HGMMA with its A operand in registers (P V in the attention kernel)
MOVES = {"MOV", "IMAD.MOV"}


def learn(listings: list[str]) -> None:
    table: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in listings:
        for ln in Path(path).read_text().splitlines():
            m = LINE.search(ln)
            if m:
                txt = re.sub(r"^@!?U?P[T\d] ", "", m.group(2))
                mnemonic = txt.split()[0].split(".")[0]
                table[int(m.group(3), 16) & 0xFFF][mnemonic] += 1
    DB.write_text(json.dumps({str(k): v.most_common(1)[0][0] for k, v in sorted(table.items())}))
    print(f"{len(table)} opcodes -> {DB}")


def sections(blob: bytes):
    """(name, offset, size) of every section of an ELF64 file."""
    hdr = elf_section_headers(blob)
    strtab = hdr[struct.unpack_from("<H", blob, 0x3E)[0]][4]  # e_shstrndx: the names' section
    for h in hdr:
        start = strtab + h[0]
        yield blob[start : blob.index(b"\0", start)].decode(), h[4], h[5]


def decode(blob: bytes, off: int, size: int, ops: dict[int, str]):
    """(address, mnemonic, branch target or None) of each instruction of a .text section."""
    out = []
    for a in range(0, size, 16):
        lo, hi = struct.unpack_from("<QQ", blob, off + a)
        k = lo & 0xFFF
        mn = ops.get(k, f"?{k:03x}")
        if k == 0x224 and (lo >> 24) & 0xFF == 0xFF and (lo >> 32) & 0xFF == 0xFF:
            mn = "IMAD.MOV"  # IMAD d, RZ, RZ, c
        if k == 0xDF0:
            mn = PV
        target = None
        if mn == "BRA":  # offset / 4: 8 bits at 16, the rest (signed) from bit 34 on
            up = (lo | hi << 64) >> 34 & ((1 << 40) - 1)
            up -= (up >> 39) << 40
            target = a + 16 + 4 * (((lo >> 16) & 0xFF) | up << 8)
        out.append((a, mn, target))
    return out


def counts(body) -> dict:
    c = collections.Counter(m for _, m, _ in body)
    keys = ("HGMMA", PV, "FMUL", "FFMA", "FADD", "MUFU", "FMNMX", "LDS", "STS", "STL", "LDL")
    return {
        "n": len(body),
        "moves": sum(c[m] for m in MOVES),
        "uniform": sum(v for k, v in c.items() if k.startswith("U") or k == "R2UR"),
        **{k.lower(): c[k] for k in keys},
    }


def kernels(path: str, ops: dict[int, str]):
    blob = Path(path).read_bytes()
    for name, off, size in sections(blob):
        if name.startswith(".text."):
            yield name[6:], decode(blob, off, size, ops)


def main_loop(ins):
    best = None
    for a, _, target in ins:
        if target is not None and target <= a:
            body = [x for x in ins if target <= x[0] <= a]
            pv = sum(m == PV for _, m, _ in body)
            if pv and (best is None or (pv, -len(body)) > (best[0], -len(best[1]))):
                best = (pv, body, target, a)
    return best


def main(argv: list[str]) -> int:
    if argv[0] == "learn":
        learn(argv[1:])
        return 0
    ops = {int(k): v for k, v in json.loads(DB.read_text()).items()}
    if argv[0] == "stats":
        for path in argv[1:]:
            for name, ins in kernels(path, ops):
                print(f"{path} {name[:48]}: all {counts(ins)}")
                best = main_loop(ins)
                if best:
                    print(f"    loop {best[2]:#x}-{best[3]:#x}: {counts(best[1])}")
        return 0
    if argv[0] == "list":
        lo_a, hi_a = int(argv[2], 16), int(argv[3], 16)
        for _, ins in kernels(argv[1], ops):
            runs: list[list] = []
            for a, mn, target in ins:
                if not lo_a <= a <= hi_a:
                    continue
                if target is not None:
                    runs.append([f"\n[{a:#x}] BRA -> {target:#x}\n", 1])
                elif runs and runs[-1][0] == mn:
                    runs[-1][1] += 1
                else:
                    runs.append([mn, 1])
            print(" ".join(m if n == 1 else f"{m}x{n}" for m, n in runs))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
