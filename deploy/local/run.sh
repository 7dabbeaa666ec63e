#!/usr/bin/env bash
# Quick start: two mock engines (SGLang flavour) and one shoal replica on
# loopback. Ctrl-C stops everything.
#   deploy/local/run.sh            # debug build (fast to compile)
#   PROFILE=release deploy/local/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

profile="${PROFILE:-debug}"
port="${SHOAL_PORT:-30000}"
engine_port="${ENGINE_BASE_PORT:-18001}"
flag=()
[ "$profile" = "release" ] && flag=(--release)

cargo build "${flag[@]}" -p shoal -p shoal-tests --bin shoal --bin mock-engine

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"target/$profile/mock-engine" --engines 2 --base-port "$engine_port" --flavor sglang &
pids+=($!)

cat <<MSG

Shoal is starting on http://127.0.0.1:$port (workers: two mock engines).
Try:
  curl -s http://127.0.0.1:$port/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"mock","messages":[{"role":"user","content":"hello"}],"max_tokens":8}'
  curl -sN http://127.0.0.1:$port/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"mock","stream":true,"messages":[{"role":"user","content":"hello"}],"max_tokens":8}'
  curl -s http://127.0.0.1:$port/workers      # health, circuit, in-flight, polled load
  curl -s http://127.0.0.1:$port/metrics      # Prometheus

MSG
"target/$profile/shoal" --host 127.0.0.1 --port "$port" \
  --worker-urls "http://127.0.0.1:$engine_port" "http://127.0.0.1:$((engine_port + 1))" &
pids+=($!)
wait "${pids[@]}"
