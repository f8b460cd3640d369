# The bench runs of this session side by side: each arm's ms and ratio to stock on the prefill
# attention cases (arguments: label=path/to/bench.json ...).
import json
import sys

arms = [a.split("=", 1) for a in sys.argv[1:]]
data = {}
for lab, path in arms:
    with open(path) as fh:
        data[lab] = {(k["family"], k["case"]): k for k in json.load(fh)["kernels"]}
first = data[arms[0][0]]
print(f"{'case':46s}" + "".join(f"{lab:>22s}" for lab, _ in arms))
for key in first:
    if "prefill" not in key[0]:
        continue
    cells = []
    for lab, _ in arms:
        k = data[lab].get(key)
        cells.append(f"{k['ours_ms']:8.4f} ms {k['ratio']:5.2f}x" if k and k["ours_ms"] else "-")
    print(f"{key[0][10:] + ' ' + key[1]:46s}" + "".join(f"{c:>22s}" for c in cells))
