#!/usr/bin/env python3
"""Query latency over HTTP against a running `engram run`: p50 and p95 per mode, no model (`"answer": false`).

Questions are the opening words (up to 8) of turns drawn with a fixed seed from the records file the space was
ingested from, so a run is repeatable.

    scripts/query_latency.py RECORDS.jsonl [--url http://127.0.0.1:7600] [--space S] [--modes flat,hybrid,...] [-n 200]
"""
import argparse
import json
import random
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--url", default="http://127.0.0.1:7600")
    ap.add_argument("--space", default=None, help="default: the first record's space")
    ap.add_argument("--modes", default="flat,hybrid,prune-and-grow,compass")
    ap.add_argument("-n", type=int, default=200, help="queries per mode")
    ap.add_argument("--token", default=None)
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(a.records) if line.strip()]
    space = a.space or recs[0]["space"]
    rng = random.Random(7)
    questions = []
    for r in rng.sample(recs, min(len(recs), 4 * a.n)):
        words = r.get("text", "").split()
        if len(words) >= 6:
            questions.append(" ".join(words[:8]))
    headers = {"content-type": "application/json"}
    if a.token:
        headers["authorization"] = f"Bearer {a.token}"
    for mode in a.modes.split(","):
        ms = []
        for i in range(a.n):
            body = json.dumps({"query": questions[i % len(questions)], "mode": mode, "answer": False}).encode()
            req = urllib.request.Request(f"{a.url}/v1/spaces/{space}/query", data=body, headers=headers)
            t = time.perf_counter()
            urllib.request.urlopen(req).read()
            ms.append((time.perf_counter() - t) * 1000)
        ms.sort()
        print(json.dumps({"mode": mode, "queries": a.n, "p50_ms": round(ms[len(ms) // 2], 1),
                          "p95_ms": round(ms[int(len(ms) * 0.95)], 1)}))


if __name__ == "__main__":
    main()
