#!/usr/bin/env python3
"""Convert public benchmark files into engram records (JSONL on stdout).

    scripts/to_records.py locomo PATH/locomo-dev.json > locomo.jsonl   # one space per conversation, turns
    scripts/to_records.py qmsum  PATH/qmsum/val        > qmsum.jsonl    # one space per meeting, turns

LoCoMo turns keep their dia_id ("D3:14") as the turn id, so evidence ids map to node ids "<conv>#<dia_id>".
QMSum turns are numbered by their index in the transcript ("t<index>").
"""
import json
import os
import sys


def locomo(path):
    for conv in json.load(open(path)):
        space = conv["sample_id"].replace("_", "-")
        c = conv["conversation"]
        n = 1
        while f"session_{n}" in c:
            when = c.get(f"session_{n}_date_time")
            for t in c[f"session_{n}"]:
                text = t["text"]
                if t.get("blip_caption"):
                    text += f" [shares a photo: {t['blip_caption']}]"
                yield {"space": space, "kind": "turn", "conversation": space, "turn": t["dia_id"],
                       "speaker": t["speaker"], "text": text, "ts": when}
            n += 1


def qmsum(path):
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json"):
            continue
        m = json.load(open(os.path.join(path, name)))
        space = name[:-5].lower()
        for i, t in enumerate(m["meeting_transcripts"]):
            if t["content"].strip():
                yield {"space": space, "kind": "turn", "conversation": space, "turn": f"t{i}", "seq": i,
                       "speaker": t["speaker"], "text": t["content"]}


if __name__ == "__main__":
    kind, path = sys.argv[1], sys.argv[2]
    for rec in {"locomo": locomo, "qmsum": qmsum}[kind](path):
        print(json.dumps(rec))
