#!/usr/bin/env bash
# Self-contained demo: mock engines and three meshed shoal replicas on
# loopback. Prints how to send requests and where /mesh/status is.
#   deploy/local/demo.sh                     # debug build (quickest to compile)
#   PROFILE=release deploy/local/demo.sh     # optimised build
#   deploy/local/demo.sh --replicas 5 --engines 8 --base-port 31000
#   deploy/local/demo.sh --quick-check       # start, send traffic, check, exit
set -euo pipefail
cd "$(dirname "$0")/../.."

profile="${PROFILE:-debug}"
flag=()
[ "$profile" = "release" ] && flag=(--release)

cargo build "${flag[@]}" -p shoal -p shoal-tests --bin shoal --bin demo
exec "target/$profile/demo" "$@"
