"""Where a Hopper kernel's instructions go, without a GPU: the SASS ptxas makes of it, by loop
and basic block.

    PYTHONPATH=. python tools/hopper_sass.py [--match TEXT] [--blocks] [--out DIR]

compiles each kernel of `hopper_ptx.kernels()` whose label contains every TEXT given (for
example `--match "bfloat16 QNarrowConfig(nt=1, warps=2" --match "bits=4"`) for sm_90a with
the NVRTC installed (the one the dev extra pins is the device's), disassembles it with
`cuobjdump -sass` and prints its registers, its instruction count and each loop (a backward
branch) with its static instruction count and most frequent opcodes; `--blocks` adds the
basic blocks of each kernel's largest loop, `--out DIR` keeps the SASS text. A static count is
not a dynamic one (branches inside a loop take one side), but the blocks say which side is
which: a k-tile's copy, its fragment reads, its dequantisation.

cuobjdump and the nvdisasm it runs come from the CUDA toolkit or from `pip install
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (no GPU needed); NVRTC from cuda-bindings and
nvidia-cuda-nvrtc (the dev extra).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hopper_ptx, beside this script

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str

    @property
    def mnemonic(self) -> str:
        """The opcode with its modifiers, without the predicate (`@P0 LDG.E.128 R4, ...` ->
        `LDG.E.128`)."""
        words = self.text.split()
        return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]

    @property
    def op(self) -> str:
        """The opcode without its modifiers or predicate (`@!P0 BRA` -> `BRA`)."""
        return self.mnemonic.split(".")[0]

    @property
    def target(self) -> int | None:
        m = _TARGET.search(self.text)
        return int(m.group(1), 16) if m else None


def parse(sass: str) -> list[Instr]:
    """The instructions of cuobjdump -sass text, in address order (one kernel's, or every
    kernel's one after another)."""
    return [Instr(int(m.group(1), 16), m.group(2)) for m in _LINE.finditer(sass)]


def loops(ins: list[Instr]) -> list[tuple[int, int, int]]:
    """(first address, last address, instructions) of every backward branch's range."""
    index = {i.addr: n for n, i in enumerate(ins)}
    out = []
    for n, i in enumerate(ins):
        t = i.target
        if t is not None and t <= i.addr and t in index:
            out.append((t, i.addr, n - index[t] + 1))
    return out


def blocks(ins: list[Instr], lo: int, hi: int) -> list[tuple[int, list[Instr]]]:
    """The basic blocks of addresses lo..hi: a block ends at a branch or before a branch
    target."""
    part = [i for i in ins if lo <= i.addr <= hi]
    targets = {i.target for i in part if i.target is not None}
    out: list[tuple[int, list[Instr]]] = []
    cur: list[Instr] = []
    for i in part:
        if i.addr in targets and cur:
            out.append((cur[0].addr, cur))
            cur = []
        cur.append(i)
        if i.op in ("BRA", "EXIT", "RET"):
            out.append((cur[0].addr, cur))
            cur = []
    if cur:
        out.append((cur[0].addr, cur))
    return out


# Tensor-core opcodes: a histogram names them wherever they occur, even outside its top few,
# since how many MMAs a block holds against its other instructions is what a reader looks for.
MMA_OPS = ("HMMA", "HGMMA")


def histogram(part: list[Instr], top: int = 6) -> str:
    """The `top` most frequent opcodes of `part` with their counts, then any MMA opcode that
    is not among them."""
    counts = Counter(i.op for i in part)
    shown = counts.most_common(top)
    shown += [(op, counts[op]) for op in MMA_OPS if counts[op] and op not in dict(shown)]
    return " ".join(f"{op} {n}" for op, n in shown)


def cuobjdump() -> str:
    """The cuobjdump on PATH, else the one nvidia-cuda-cuobjdump installs."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for sub in ("cu13", "cu12", "cuda_cuobjdump"):
        p = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / sub / "bin" / "cuobjdump"
        if p.is_file():
            return str(p)
    raise SystemExit(
        "hopper_sass: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
    )


def sass_of(sp, tmpl, inputs, dtype, tool: str) -> tuple[str, int]:
    """(SASS text, registers) of one kernel, compiled by NVRTC for sm_90a."""
    from hopper_ptx import render

    from bi_rl.backends.cuda import mlx_jit, nvrtc

    source = render(sp, tmpl, inputs, dtype, "hopper_sass")
    entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, tmpl)
    built = nvrtc.compile_cubin(
        source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(built.cubin)
        f.flush()
        # cuobjdump runs nvdisasm, which the pip packages put beside it
        env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        run = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"hopper_sass: cuobjdump failed: {run.stderr.strip()}")
    return run.stdout, built.registers


def report(label: str, sass: str, registers: int, with_blocks: bool) -> list[str]:
    ins = parse(sass)
    lines = [f"{label}: {registers} registers, {len(ins)} instructions"]
    found = loops(ins)
    for lo, hi, n in found:
        part = [i for i in ins if lo <= i.addr <= hi]
        lines.append(f"  loop {lo:#06x}..{hi:#06x}: {n} instructions ({histogram(part)})")
    if with_blocks and found:
        lo, hi, _ = max(found, key=lambda x: x[2])
        lines.append(f"  blocks of loop {lo:#06x}..{hi:#06x}:")
        for start, part in blocks(ins, lo, hi):
            tail = f" -> {part[-1].text}" if part[-1].op == "BRA" else ""
            lines.append(f"    {start:#06x}: {len(part):4d} ({histogram(part)}){tail}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--match", action="append", default=[], metavar="TEXT", help="label must contain TEXT"
    )
    p.add_argument("--blocks", action="store_true", help="basic blocks of the largest loop")
    p.add_argument("--out", type=Path, help="write each kernel's SASS here")
    args = p.parse_args(argv)
    from hopper_ptx import file_stem, kernels

    tool = cuobjdump()
    count = 0
    for label, *kernel in kernels():
        if not all(m in label for m in args.match):
            continue
        sass, registers = sass_of(*kernel, tool)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / (file_stem(label) + ".sass")).write_text(sass)
        print("\n".join(report(label, sass, registers, args.blocks)), flush=True)
        count += 1
    if not count:
        print(f"hopper_sass: no kernel label contains {args.match}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
