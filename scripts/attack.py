#!/usr/bin/env python3
# Hostile requests against a fresh engine on loopback, each measured: status, seconds, response and dead-letter sizes,
# peak resident memory (VmHWM). `cargo build --release -p engram && python3 scripts/attack.py`.
import json, os, socket, subprocess, sys, time, threading, tempfile, http.client, resource
import argparse
ap = argparse.ArgumentParser(description="The hostile requests of the doors-and-locks issue against a fresh engine; prints what each got (JSON).")
ap.add_argument("--engram", default="target/release/engram")
args = ap.parse_args()
E = args.engram
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
def rss(pid, key):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith(key): return int(l.split()[1]) * 1024
def start(env={}, port=7800):
    d = tempfile.mkdtemp()
    e = dict(os.environ, ENGRAM_LOG="warn", **env)
    p = subprocess.Popen([E, "run", "--data-dir", d, "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{port+1}"], env=e)
    for _ in range(200):
        try: socket.create_connection(("127.0.0.1", port)).close(); break
        except OSError: time.sleep(0.05)
    time.sleep(0.3)
    return p, d
def req(port, method, path, body=b"", headers={}):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t = time.time(); c.request(method, path, body=body, headers=headers); r = c.getresponse(); data = r.read()
    return r.status, len(data), time.time() - t, data[:160]
def raw_req(port, path, body):
    s = socket.create_connection(("127.0.0.1", port)); t = time.time()
    try:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except (BrokenPipeError, ConnectionResetError): pass
    data = b""
    try:
        while True:
            r = s.recv(65536)
            if not r: break
            data += r
    except ConnectionResetError: pass
    return int(data[9:12] or 0), time.time() - t, data[-160:]
def big(n):
    s = "[" + "{}," * ((n - 3) // 3) + "{}]"
    return s.encode()
out = {}
p, d = start()
base = rss(p.pid, "VmRSS:")
for name, body in [("9MB", big(9_000_000)), ("64MiB", big((64 << 20) - 8))]:
    st, size, dt, head = req(7800, "POST", "/v1/spaces/a/records", body)
    dl = os.path.getsize(f"{d}/dead-letter.jsonl") if os.path.exists(f"{d}/dead-letter.jsonl") else 0
    out[name] = dict(status=st, resp_bytes=size, seconds=round(dt, 3), dead_letter_bytes=dl, rss_start_mb=round(base/2**20,1), peak_mb=round(rss(p.pid, "VmHWM:")/2**20, 1), head=head.decode())
body = json.dumps([{}] * 10000).encode()
st, size, dt, head = req(7800, "POST", "/v1/spaces/a/records", body)
out["10k records"] = dict(status=st, resp_bytes=size, seconds=round(dt, 3), dead_letter_bytes=os.path.getsize(f"{d}/dead-letter.jsonl"), peak_mb=round(rss(p.pid, "VmHWM:")/2**20, 1))
for n in (3000, 10000):
    q = json.dumps({"query": "why did it rain and " * n}).encode()
    st, size, dt, head = req(7800, "POST", "/v1/spaces/a/query", q)
    out[f"{n} clauses"] = dict(status=st, seconds=round(dt, 4), chars=len(q), head=head.decode())
# slowloris: 1000 connections that send half their headers
socks = []
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", 7800)); s.sendall(b"GET /v1/spaces HTTP/1.1\r\nHost: x\r\nX-Slow: "); socks.append(s)
lat = []
for i in range(20):
    st, size, dt, head = req(7800, "GET", "/healthz"); lat.append(dt)
t0 = time.time(); closed = 0
for s in socks:
    s.settimeout(15)
    try:
        r = s.recv(100)
        if r == b"" or r.startswith(b"HTTP/1.1 408"): closed += 1
    except Exception: pass
out["slowloris 1000"] = dict(healthz_max_ms=round(max(lat)*1000, 1), healthz_median_ms=round(sorted(lat)[10]*1000, 1), all_cut_after_s=round(time.time()-t0, 1), closed=closed)
st, size, dt, head = req(7801, "GET", "/healthz")
out["healthz after"] = st
p.terminate(); p.wait()
# with tokens: the same 64 MiB body without a token
tok = tempfile.mktemp()
h = subprocess.run([E, "token", "hash"], input=b"secret-token-xyz\n", capture_output=True).stdout.decode().strip()
open(tok, "w").write(f'[[tokens]]\nname = "a"\nhash = "{h}"\nscope = "write"\nspaces = ["*"]\n')
p, d = start({"ENGRAM__AUTH__TOKENS_FILE": tok}, 7810)
base = rss(p.pid, "VmRSS:")
st, dt, head = raw_req(7810, "/v1/spaces/a/records", big((64 << 20) - 8))
out["64MiB no token"] = dict(status=st, seconds=round(dt, 3), rss_start_mb=round(base/2**20,1), peak_mb=round(rss(p.pid, "VmHWM:")/2**20, 1), head=head.decode())
p.terminate(); p.wait()
print(json.dumps(out, indent=1))
