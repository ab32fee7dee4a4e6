#!/usr/bin/env python3
"""Restart of one space, with and without a checkpoint: how long until the memory serves again, and whether it is the
memory from before the stop.

    scripts/restart_bench.py RECORDS.jsonl [--engram target/release/engram] [--space NAME]

Builds the memory from RECORDS.jsonl (`engram run --input`), stops it cleanly (the last checkpoint is written), then
restarts it twice from the same data directory: from the checkpoint, and with checkpoints off (a rebuild from the
logs). Prints one JSON object: the build time, the stop time, the checkpoint's size, and per restart the time until
the space's statistics equal those before the stop (`ready_s`) and, from the checkpoint, until the dataflow has
rebuilt behind it (`rebuilt_s`) and until the structure has rebuilt the hierarchy behind it (`hierarchy_rebuilt_s`), whether the space's statistics then still equal those before the stop and how many
updates the rebuilt dataflow differed from the checkpoint in (`engram_checkpoint_rebuild_differences`), with the input
log's lines and how many of them that start compacted away.
`--env KEY=VALUE` sets the restarts' environment; `--no-rebuild` skips the restart without a checkpoint (whose wait
for an equal memory does not end where the HNSW index makes a rebuild differ, from about 20,000 nodes), and
`ready_share_of_build` is the checkpoint's `ready_s` over the first build's time; `--keep DIR` copies the data
directory as the clean stop left it. Each engine's log stays in the temporary directory
(`engram-restart-*-N.log`).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


class Engine:
    runs = 0

    def __init__(self, binary, data_dir, args=(), env=()):
        self.api, self.admin = free_port(), free_port()
        e = dict(os.environ, ENGRAM_LOG="info", **dict(env))
        cmd = [binary, "run", "--data-dir", data_dir, "--listen", f"127.0.0.1:{self.api}",
               "--admin", f"127.0.0.1:{self.admin}", *args]
        Engine.runs += 1
        # Each engine's log, kept after the data directory goes: why a restart rebuilt, if it did.
        self.log = os.path.join(tempfile.gettempdir(), f"{os.path.basename(data_dir)}-{Engine.runs}.log")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=e, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def space(self, name):
        body = get(f"http://127.0.0.1:{self.api}/v1/spaces")
        if body is None:
            return None
        for s in json.loads(body)["spaces"]:
            if s["space"] == name:
                s.pop("as_of", None)
                s.pop("hierarchy_as_of", None)
                return s
        return None

    def metric(self, name):
        body = get(f"http://127.0.0.1:{self.admin}/metrics") or ""
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def wait(self, cond, limit=3600):
        while time.monotonic() - self.started < limit:
            v = cond()
            if v:
                return time.monotonic() - self.started, v
            if self.proc.poll() is not None:
                sys.exit(f"engram exited with {self.proc.returncode} (log: {self.log})")
            time.sleep(0.05)
        self.proc.kill()
        sys.exit(f"timed out (log: {self.log})")

    def stop(self):
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--engram", default="target/release/engram")
    ap.add_argument("--space", default=None)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for the restarts (e.g. ENGRAM__CHECKPOINT__COMPACT_MIN_SHARE=1)")
    ap.add_argument("--no-rebuild", action="store_true", help="skip the restart without a checkpoint")
    ap.add_argument("--keep", metavar="DIR", help="copy the data directory, as the clean stop left it, to DIR "
                    "(to restart it again, e.g. under a profiler)")
    a = ap.parse_args()
    env = [tuple(kv.split("=", 1)) for kv in a.env]
    first = json.loads(open(a.records).readline())
    space = a.space or first["space"]
    dir_ = tempfile.mkdtemp(prefix="engram-restart-")
    try:
        e = Engine(a.engram, dir_, ["--input", a.records])
        last = {"v": None, "since": None}

        want_lines = sum(1 for line in open(a.records) if line.strip())

        def logged():
            """The input log's lines and the epoch of its last record."""
            try:
                text = open(os.path.join(dir_, "input.log")).read()
            except OSError:
                return 0, None
            # Only whole lines: the engine may be writing the last one.
            lines = text[: text.rfind("\n") + 1].splitlines()
            if not lines:
                return 0, None
            return len(lines), json.loads(lines[-1].split("\t")[0])["epoch"]

        def settled():
            # Every record logged, its epoch reflected in layer 0 and the hierarchy, then 3 s without change.
            lines, epoch = logged()
            body = get(f"http://127.0.0.1:{e.api}/v1/spaces")
            if lines < want_lines or body is None:
                return None
            clock = json.loads(body)
            if (clock.get("as_of") or -1) < epoch or (clock.get("hierarchy_as_of") or -1) < epoch:
                return None
            s = e.space(space)
            if s is None or s.get("summaries_pending", 1) != 0:
                return None
            if s != last["v"]:
                last["v"], last["since"] = s, time.monotonic()
                return None
            return s if time.monotonic() - last["since"] > 3.0 else None

        built_s, before = e.wait(settled)
        built_s -= 3.0
        stop_s = e.stop()
        size = os.path.getsize(os.path.join(dir_, "checkpoint.bin"))
        if a.keep:
            shutil.copytree(dir_, a.keep)
        out = {"records": a.records, "space": space, "nodes": before["nodes"], "build_s": round(built_s, 2),
               "stop_s": round(stop_s, 2), "checkpoint_bytes": size}
        lines = sum(1 for _ in open(os.path.join(dir_, "input.log")))
        r = Engine(a.engram, dir_, env=env)
        ready_s, _ = r.wait(lambda: e_eq(r.space(space), before))
        rebuilt_s, _ = r.wait(lambda: r.metric("engram_checkpoint_rebuilding") == 0.0)
        hierarchy_s, _ = r.wait(lambda: r.metric("engram_checkpoint_hierarchy_rebuilding") == 0.0)
        # The views take the rebuilt state (where it differs from the checkpoint) just after the rebuild passes it.
        time.sleep(1.0)
        same = r.space(space) == before
        differences = r.metric("engram_checkpoint_rebuild_differences")
        compacted = r.metric("engram_input_log_compacted_lines_total")
        r.stop()
        out["from_checkpoint"] = {"ready_s": round(ready_s, 2), "rebuilt_s": round(rebuilt_s, 2),
                                  "hierarchy_rebuilt_s": round(hierarchy_s, 2),
                                  "equal_after_rebuild": same, "rebuild_differences": int(differences or 0),
                                  "log_lines": lines,
                                  "compacted_lines": int(compacted or 0)}
        out["ready_share_of_build"] = round(out["from_checkpoint"]["ready_s"] / built_s, 3)
        if a.no_rebuild:
            print(json.dumps(out))
            return
        r = Engine(a.engram, dir_, env=env + [("ENGRAM__CHECKPOINT__INTERVAL", "0s")])
        ready_s, _ = r.wait(lambda: e_eq(r.space(space), before))
        r.stop()
        out["rebuild"] = {"ready_s": round(ready_s, 2)}
        out["ready_share"] = round(out["from_checkpoint"]["ready_s"] / out["rebuild"]["ready_s"], 3)
        print(json.dumps(out))
    finally:
        shutil.rmtree(dir_, ignore_errors=True)


def e_eq(s, want):
    return s is not None and s == want


if __name__ == "__main__":
    main()
