#!/usr/bin/env bash
# A local Kafka-compatible broker for tests and trials: tansu (crates.io, Apache-2.0) on 127.0.0.1:9092 with SQLite
# storage under .kafka/ (gitignored).
#   scripts/kafka-broker.sh start | stop
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(pwd)/.kafka"
bin="${TANSU_BIN:-$(command -v tansu || echo "$HOME/.cache/engram/tansu/bin/tansu")}"
case "${1:-}" in
start)
    if [ ! -x "$bin" ]; then
        echo "building tansu 0.6.0 (once)"
        # A test broker needs no full optimisation: at opt-level 1 it builds in about 8 minutes on 2 cores (about 30 at 3).
        CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_INCREMENTAL=0 cargo install tansu --version 0.6.0 --locked --features dynostore,libsql --root "$HOME/.cache/engram/tansu" \
            --target-dir "$HOME/.cache/engram/tansu-target"
        rm -rf "$HOME/.cache/engram/tansu-target"
        bin="$HOME/.cache/engram/tansu/bin/tansu"
    fi
    mkdir -p "$dir"
    (
        cd "$dir"
        nohup "$bin" broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
            --storage-engine sqlite://tansu.db > broker.log 2>&1 &
        echo $! > broker.pid
    )
    for _ in $(seq 1 100); do
        if (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null; then
            echo "tansu is listening on 127.0.0.1:9092 (log: $dir/broker.log)"
            exit 0
        fi
        sleep 0.1
    done
    echo "tansu did not start:" >&2
    cat "$dir/broker.log" >&2
    exit 1
    ;;
stop)
    if [ -f "$dir/broker.pid" ]; then
        kill -TERM "$(cat "$dir/broker.pid")" 2>/dev/null || true
        rm -f "$dir/broker.pid"
    fi
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
