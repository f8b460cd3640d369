"""Each case's own kernel time from an Nsight Compute CSV of `tools/cuda_profile.py CASE...`.

    ncu --metrics gpu__time_duration.sum --csv python tools/cuda_profile.py CASES > run.csv
    python tools/ncu_times.py run.csv CASES [--json out.json]

cuda_profile.py runs its cases in the order given, each building its inputs (MLX's random
and quantize kernels) and then launching its op three times. Here the kernels that build
inputs are set aside by name; what is left comes in one run of launches a case, in case
order. A case's time per call is the median over its three calls of the sum of the kernels
one call launched (cuBLAS may launch a product and a split-K reduction). Then each case is
printed beside its `stock-` twin with the ratio ours / stock. A run whose launches cannot be
divided into the cases given (a case with no launches, or a count that is not a multiple
of three) is refused: the attribution would be a guess.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys

# MLX kernels that build a case's inputs (mx.random, mx.quantize, casts), never the op's
SETUP = ("rbitsc", "copy_v<", "binary_", "unary_v<", "affine_quantize<")


def read(path: str) -> list[tuple[str, float]]:
    """(kernel name, duration in microseconds) per launch, in launch order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if head is None:
        raise ValueError(f'{path}: no ncu CSV header (a line starting with "ID")')
    cols = rows[head]
    name, metric, value = (cols.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value"))
    out = []
    for r in rows[head + 1 :]:
        if len(r) == len(cols) and r[metric] == "gpu__time_duration.sum":
            out.append((r[name], float(r[value].replace(",", "")) / 1000))
    return out


def is_setup(kernel: str) -> bool:
    short = kernel.removeprefix("void ").removeprefix("mlx::")
    return short.startswith(SETUP)


def per_case(launches: list[tuple[str, float]], cases: list[str]) -> dict[str, dict]:
    """Each case's op launches (the runs of non-setup kernels, one run a case) and its time
    per call."""
    runs, current = [], []
    for kernel, us in launches:
        if is_setup(kernel):
            if current:
                runs.append(current)
                current = []
        else:
            current.append((kernel, us))
    if current:
        runs.append(current)
    if len(runs) != len(cases):
        raise ValueError(f"{len(runs)} runs of op launches for {len(cases)} cases")
    result = {}
    for case, run in zip(cases, runs, strict=True):
        if len(run) % 3:
            raise ValueError(f"{case}: {len(run)} launches, not three calls' worth")
        per = len(run) // 3
        calls = [run[i * per : (i + 1) * per] for i in range(3)]
        result[case] = {
            "us": statistics.median(sum(us for _, us in call) for call in calls),
            "kernels": [k.split("(")[0] for k, _ in calls[0]],
        }
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="ncu --csv output with gpu__time_duration.sum")
    p.add_argument("cases", nargs="+", metavar="CASE", help="the cases, in the order they ran")
    p.add_argument("--json", help="write the per-case times here")
    args = p.parse_args(argv)
    try:
        times = per_case(read(args.csv), args.cases)
    except (OSError, ValueError) as e:
        print(f"ncu_times: {e}", file=sys.stderr)
        return 1
    print(f"{'case':<24} {'ours us':>8} {'stock us':>9} {'ratio':>6}  ours' kernel / stock's")
    for case, t in times.items():
        if case.startswith("stock-"):
            continue
        s = times.get(f"stock-{case}")
        if s is None:
            print(f"{case:<24} {t['us']:8.2f}")
            continue
        ratio = t["us"] / s["us"]
        kernels = f"{t['kernels'][0][:40]} / {' + '.join(k[:36] for k in s['kernels'])}"
        print(f"{case:<24} {t['us']:8.2f} {s['us']:9.2f} {ratio:6.2f}  {kernels}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
