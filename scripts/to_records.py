#!/usr/bin/env python3
"""Convert public benchmark files into engram records (JSONL on stdout).

    scripts/to_records.py locomo PATH/locomo-dev.json > locomo.jsonl   # one space per conversation, turns
    scripts/to_records.py qmsum  PATH/qmsum/val        > qmsum.jsonl    # one space per meeting, turns
    scripts/to_records.py qmsum  PATH/qmsum/train --one-space meetings > meetings.jsonl
                                  # every meeting in ONE space "meetings", one conversation per meeting

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


def qmsum(path, one_space=None):
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json"):
            continue
        m = json.load(open(os.path.join(path, name)))
        meeting = name[:-5].lower()
        space = one_space or meeting
        for i, t in enumerate(m["meeting_transcripts"]):
            if t["content"].strip():
                yield {"space": space, "kind": "turn", "conversation": meeting, "turn": f"t{i}", "seq": i,
                       "speaker": t["speaker"], "text": t["content"]}


if __name__ == "__main__":
    args = sys.argv[1:]
    one_space = None
    if "--one-space" in args:
        at = args.index("--one-space")
        one_space = args[at + 1]
        del args[at:at + 2]
    kind, path = args[0], args[1]
    if kind == "locomo":
        if one_space:
            sys.exit("--one-space is for qmsum")
        records = locomo(path)
    else:
        records = qmsum(path, one_space)
    for rec in records:
        print(json.dumps(rec))
