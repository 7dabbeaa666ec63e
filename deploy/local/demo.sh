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
if [ "$profile" = "release" ]; then
  echo "demo: building optimised binaries (whole-program LTO: the first time takes ~12 min on 2 cores)" >&2
  cargo build --release -p shoal -p shoal-tests --bin shoal --bin demo
else
  # Every target, with the features the test build uses: `cargo test
  # --workspace` afterwards reuses all of it instead of compiling again.
  echo "demo: building (the first time takes ~5 min on 2 cores; later runs and the tests reuse it)" >&2
  cargo build --workspace --all-targets
fi
exec "target/$profile/demo" "$@"
