#!/usr/bin/env bash
# Ecosystem checks with real tools none of us wrote:
#   hadolint (deploy/Dockerfile), kubernetes-validate --strict (deploy/kubernetes),
#   the compose-spec JSON schema (deploy/compose), then a live loopback fleet
#   (2 mock engines, 3 meshed replicas sharing one wildcard certificate):
#   promtool check metrics on a /metrics scrape, and the official openai SDK.
# Run from anywhere; installs its tools itself (venv under ~/.cache, apt for
# promtool). Uses target/debug/{shoal,mock-engine}, building them if missing.
# Every check runs even if an earlier one failed (setup errors stop at once);
# the last line is "ecosystem: N passed, N failed", and the exit code is 1 on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=1.34.0 # a version the pinned kubernetes-validate ships schemas for
here=.ci/ecosystem
venv="${XDG_CACHE_HOME:-$HOME/.cache}/shoal-ecosystem/venv"
tmp=$(mktemp -d)
pids=()
passed=0 failed=0 summarized='' dump_logs=''
started=$SECONDS

summary() {
  summarized=1
  echo "ecosystem took $((SECONDS - started)) s"
  echo "ecosystem: $passed passed, $failed failed"
}
cleanup() {
  local rc=$? pid _ alive
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do # up to 5 s for a clean exit, then SIGKILL
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  if [ -n "$dump_logs" ]; then
    for log in "$tmp"/*.log; do
      [ -f "$log" ] && { echo "--- last lines of $(basename "$log")"; tail -n 15 "$log"; }
    done
  fi
  if [ "$rc" != 0 ] && [ -z "$summarized" ]; then
    failed=$((failed + 1))
    summary
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "FAIL: $*" >&2; dump_logs=1; exit 1; } # setup error: nothing after it can run
# check NAME CMD...: runs CMD, counts it, goes on either way.
check() {
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1)); echo "ok: $name"
  else
    failed=$((failed + 1)); echo "FAIL: $name"
  fi
}

# --- tools -------------------------------------------------------------------
echo "== tools"
apt_updated=
apt_install() {
  [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v curl >/dev/null || apt_install curl ca-certificates
command -v promtool >/dev/null || apt_install prometheus # bookworm's prometheus ships promtool
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$venv"; }
fi
if ! cmp -s "$here/requirements.txt" "$venv/.shoal-requirements"; then # reinstall when the pins change
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$venv/.shoal-requirements"
fi
py="$venv/bin/python"
echo "hadolint $("$venv/bin/hadolint" --version | awk '{print $NF}')," \
  "kubernetes-validate $("$venv/bin/kubernetes-validate" --version)," \
  "promtool $(promtool --version 2>&1 | awk 'NR == 1 {print $3}')," \
  "openai $("$py" -c 'import openai; print(openai.__version__)')"

# --- static checks -------------------------------------------------------------
echo "== deploy files"
hadolint_cfg=()
[ -f deploy/.hadolint.yaml ] && hadolint_cfg=(--config deploy/.hadolint.yaml)
check "hadolint deploy/Dockerfile" "$venv/bin/hadolint" "${hadolint_cfg[@]}" deploy/Dockerfile
check "kustomization lists every manifest" "$py" "$here/helpers.py" kustomization deploy/kubernetes
manifests=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f") # not a cluster object
done
check "kubernetes-validate --strict -k $K8S_VERSION (${#manifests[@]} files)" \
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "${manifests[@]}"
# The base as `kubectl apply -k` sends it: rendered by kustomize, then
# validated whole (namespaces, generated ConfigMap name, RBAC included).
command -v kubectl >/dev/null || {
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
} || die "kubectl is required (Debian package kubernetes-client)"
check "kubectl kustomize deploy/kubernetes renders" \
  sh -c "kubectl kustomize deploy/kubernetes >'$tmp/rendered.yaml'"
check "kubernetes-validate --strict -k $K8S_VERSION (rendered base)" \
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$tmp/rendered.yaml"
check "compose-spec schema: deploy/compose/docker-compose.yaml" \
  "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose/docker-compose.yaml

# --- live fleet on loopback ------------------------------------------------------
echo "== live fleet: 2 mock engines, 3 meshed replicas"
[ -x target/debug/shoal ] && [ -x target/debug/mock-engine ] \
  || cargo build --locked -p shoal -p shoal-tests --bin shoal --bin mock-engine
shoal=target/debug/shoal

# One wildcard leaf for every replica, as in deploy/kubernetes: this also checks
# that the mesh accepts r1/r2/r3.shoal-mesh.ci.svc.cluster.local under it.
domain='shoal-mesh.ci.svc.cluster.local'
"$shoal" mesh gen-certs --out "$tmp/certs" --nodes "*.$domain" >/dev/null
ca="$tmp/certs/ca.pem" cert="$tmp/certs/*.$domain.pem" key="$tmp/certs/*.$domain-key.pem"

engines=()
for flavor in sglang vllm; do
  target/debug/mock-engine --engines 1 --base-port 0 --flavor "$flavor" --time-scale 10 \
    >"$tmp/engine-$flavor.log" 2>&1 &
  pids+=($!)
  for ((t = 0; t < 100; t++)); do # 20 s
    grep -q 'listening on' "$tmp/engine-$flavor.log" && break
    sleep 0.2
  done
  engines+=("$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/engine-$flavor.log" | head -n1)") \
    || die "mock-engine ($flavor) did not start"
done

read -r h1 g1 q1 h2 g2 q2 h3 g3 q3 <<<"$("$py" "$here/helpers.py" ports 9)"
[ -n "${q3:-}" ] || die "no free ports"
seeds="127.0.0.1:$g1,127.0.0.1:$g2,127.0.0.1:$g3" # each replica seeds all, itself included
fast=(--drain-settle-secs 0 --health-check-interval-secs 1 --load-poll-interval-ms 250)

# r1: flags only (the README's form), with a tenant (docs/tenants.md), so
# the scrape has the tenant metrics the dashboard reads.
tenant_key=ci-tenant-key-0001
printf '[tenants.ci]\nkeys = ["%s"]\nrequests_per_minute = 100000\n' "$tenant_key" >"$tmp/tenants.toml"
# shellcheck disable=SC2086 # one argument per seed
"$shoal" --host 127.0.0.1 --port "$h1" --worker-urls "${engines[@]}" "${fast[@]}" \
  --tenants-file "$tmp/tenants.toml" \
  --mesh-name "r1.$domain" --mesh-host 127.0.0.1 --mesh-port "$g1" --mesh-quic-port "$q1" \
  --mesh-tls-ca "$ca" --mesh-tls-cert "$cert" --mesh-tls-key "$key" \
  --mesh-peer-urls ${seeds//,/ } >"$tmp/r1.log" 2>&1 &
pids+=($!)
# r2: SHOAL_* variables with comma-separated lists (the compose file's form).
env SHOAL_HOST=127.0.0.1 SHOAL_PORT="$h2" SHOAL_WORKER_URLS="${engines[0]},${engines[1]}" \
  SHOAL_MESH_NAME="r2.$domain" SHOAL_MESH_HOST=127.0.0.1 SHOAL_MESH_PORT="$g2" SHOAL_MESH_QUIC_PORT="$q2" \
  SHOAL_MESH_TLS_CA="$ca" SHOAL_MESH_TLS_CERT="$cert" SHOAL_MESH_TLS_KEY="$key" SHOAL_MESH_PEER_URLS="$seeds" \
  "$shoal" "${fast[@]}" >"$tmp/r2.log" 2>&1 &
pids+=($!)
# r3: the Kubernetes form: deploy/kubernetes/shoal.toml (its engines swapped
# for the loopback ones, so nothing leaves the machine) plus the Deployment's
# mesh variables, advertise host included.
{
  grep -v '^discovery' deploy/kubernetes/shoal.toml
  echo "worker-urls = [\"${engines[0]}\", \"${engines[1]}\"]"
} >"$tmp/shoal.toml"
grep -q '^discovery' deploy/kubernetes/shoal.toml || die "shoal.toml no longer configures discovery: update this swap"
env SHOAL_CONFIG="$tmp/shoal.toml" SHOAL_HOST=127.0.0.1 SHOAL_PORT="$h3" \
  SHOAL_MESH_HOST=127.0.0.1 SHOAL_MESH_ADVERTISE_HOST=127.0.0.1 SHOAL_MESH_NAME="r3.$domain" \
  SHOAL_MESH_PORT="$g3" SHOAL_MESH_QUIC_PORT="$q3" SHOAL_MESH_PEER_URLS="$seeds" \
  SHOAL_MESH_TLS_CA="$ca" SHOAL_MESH_TLS_CERT="$cert" SHOAL_MESH_TLS_KEY="$key" \
  "$shoal" "${fast[@]}" >"$tmp/r3.log" 2>&1 &
pids+=($!)

urls=("http://127.0.0.1:$h1" "http://127.0.0.1:$h2" "http://127.0.0.1:$h3")
replicas=("${pids[@]: -3}")
for i in 0 1 2; do # 30 s each; fail fast if a replica exited (bad flag, port taken)
  for ((t = 0; t < 150; t++)); do
    kill -0 "${replicas[$i]}" 2>/dev/null || die "replica r$((i + 1)) exited"
    curl -fsS --max-time 2 "${urls[$i]}/readiness" >/dev/null 2>&1 && break
    sleep 0.2
  done
  ((t < 150)) || die "${urls[$i]} not ready within 30 s"
done
echo "ready: ${urls[*]}"
"$py" "$here/helpers.py" mesh-wait 30 "${urls[@]}" || die "the mesh did not form"

# Some traffic on every replica: non-stream, stream, and one bad body (400),
# all with the tenant's key (r1 needs a key; the others pass it on).
traffic() {
  local u code body='{"model":"mock/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_tokens":8'
  local key="Authorization: Bearer $tenant_key"
  for u in "${urls[@]}"; do
    for _ in 1 2 3; do
      curl -fsS --max-time 20 "$u/v1/chat/completions" -H 'content-type: application/json' \
        -H "$key" -d "$body}" >/dev/null || return 1
    done
    curl -fsSN --max-time 20 "$u/v1/chat/completions" -H 'content-type: application/json' \
      -H "$key" -d "$body,\"stream\":true}" >"$tmp/stream.txt" || return 1
    grep -q '^data: \[DONE\]' "$tmp/stream.txt" || { echo "$u: stream without [DONE]"; return 1; }
    code=$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$u/v1/chat/completions" \
      -H "$key" -d 'not json')
    [ "$code" = 400 ] || { echo "$u: bad JSON answered $code, not 400"; return 1; }
  done
}
check "traffic: 12 chat requests and 3 bad bodies over 3 replicas" traffic

echo "== promtool check metrics (live scrape, mesh on)"
sleep 1 # a sync interval and a load poll
curl -fsS --max-time 5 "${urls[0]}/metrics" >"$tmp/metrics.txt" || die "scrape ${urls[0]}/metrics"
check "scrape shows the mesh: shoal_mesh_peers_connected 2" \
  grep -Eq '^shoal_mesh_peers_connected 2$' "$tmp/metrics.txt"
families=$(grep -c '^# TYPE' "$tmp/metrics.txt")
check "promtool check metrics ($families families)" \
  promtool check metrics <"$tmp/metrics.txt"
[ -z "${KEEP_METRICS:-}" ] || cp "$tmp/metrics.txt" "$KEEP_METRICS" # KEEP_METRICS=FILE keeps the scrape
check "Grafana dashboard: every metric it names is in the scrape" \
  "$py" "$here/helpers.py" dashboard deploy/grafana/shoal-dashboard.json "$tmp/metrics.txt" "$tmp/dashboard-rules.yml"
check "Grafana dashboard: promtool check rules (every PromQL expression parses)" \
  promtool check rules "$tmp/dashboard-rules.yml"
# Doc drift, a warning only: families in the scrape missing from the
# metrics table (docs/operations.md, "Metrics").
missing=$(awk '/^# TYPE /{print $3}' "$tmp/metrics.txt" | while read -r m; do
  grep -qF "\`$m\`" docs/operations.md || echo "$m"; done | tr '\n' ' ')
[ -z "$missing" ] || echo "WARN: docs/operations.md metrics table lacks: $missing"

echo "== openai SDK"
check "openai SDK: chat, completions, responses (each also streamed), embeddings, models" \
  env SHOAL_TEST_API_KEY="$tenant_key" "$py" "$here/test_openai.py" "${urls[@]}"

summary
[ "$failed" = 0 ]
