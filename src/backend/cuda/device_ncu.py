#!/usr/bin/env python3
"""device_ncu.py NCU.csv - per-kernel device time from `ncu --csv --metrics gpu__time_duration.sum`:
launches, total and mean microseconds per kernel name, largest total first."""
import csv, sys
from collections import defaultdict

tot, cnt = defaultdict(float), defaultdict(int)
rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0].split("<")[0]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    v = v / 1000 if unit.startswith("n") else v * 1000 if unit.startswith("m") else v
    tot[name] += v
    cnt[name] += 1
s = sum(tot.values())
print(f"{sum(cnt.values())} launches, {s:.1f} us")
for k in sorted(tot, key=lambda k: -tot[k]):
    print(f"{k:40s} {cnt[k]:6d} launches {tot[k]:10.1f} us {tot[k] / cnt[k]:8.2f} us/launch {100 * tot[k] / s:5.1f}%")
