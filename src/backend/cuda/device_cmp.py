#!/usr/bin/env python3
"""device_cmp.py A.safetensors B.safetensors - max |a - b| and max |a| of every F32 tensor two
`drama forward --dump` files share (CUDA vs CPU), and whether any value is NaN."""
import json, struct, sys
import numpy as np

def load(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n
        f.seek(0)
        raw = f.read()
    out = {}
    for k, v in h.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[base + a:base + b], dtype=np.float32).reshape(v["shape"])
    return out

A, B = load(sys.argv[1]), load(sys.argv[2])
bad = 0
for k in sorted(set(A) & set(B)):
    a, b = A[k].astype(np.float64), B[k].astype(np.float64)
    nan = bool(np.isnan(a).any() or np.isnan(b).any())
    d = np.abs(a - b)
    per_row = d.reshape(d.shape[0], -1).max(axis=1) if d.ndim > 1 else d
    print(f"{k}: shape {list(a.shape)} max|diff| {d.max():.3e} max|value| {np.abs(b).max():.3e} "
          f"relative {d.max() / max(np.abs(b).max(), 1e-30):.2e} nan {nan} per-row max {np.array2string(per_row, precision=2)}")
    bad |= nan
sys.exit(1 if bad else 0)
