#!/usr/bin/env python3
"""device_rows.py MODEL_DIR OUT_DIR - prompt rows for the full-shape runs on the GPU machine.

rows100.json: 10 text rows, 60 audio rows (a stand-in reference voice: random codes), 30 text rows,
one prefill call. rows16.json: 8 prefill rows + 8 decode rows, text and audio mixed (CUDA vs CPU
logits over 16 steps). Token ids and code ranges come from MODEL_DIR/config.json."""
import json, random, sys

d, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(d + "/config.json"))
S = cfg["semantic_start_token_id"]
nsem = cfg["semantic_end_token_id"] - S
ad = next(v for v in cfg.values() if isinstance(v, dict) and "num_codebooks" in v)
nc = ad["num_codebooks"]
rng = random.Random(5)

def text(i):
    return [32 + (i * 7) % 90] + [0] * nc

def audio():
    c0 = rng.randrange(min(nsem, 4096))
    return [S + c0, c0] + [rng.randrange(1024) for _ in range(nc - 1)]

rows = [text(i) for i in range(10)] + [audio() for _ in range(60)] + [text(i) for i in range(30)]
json.dump({"rows": rows, "prefill": len(rows)}, open(out + "/rows100.json", "w"))
r16 = [text(i) for i in range(4)] + [audio() for _ in range(4)] + [audio() for _ in range(5)] + [text(i) for i in range(3)]
json.dump({"rows": r16, "prefill": 8}, open(out + "/rows16.json", "w"))
print("rows100.json: 100 rows (60 audio), rows16.json: 8 prefill + 8 decode; semantic start", S, "codebooks", nc)
