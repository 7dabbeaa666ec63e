#!/usr/bin/env bash
# proxy-bench: what does a hop through shoal cost, next to nginx?
#
# One mock engine (tiny non-streamed answers: max_tokens 1, time scale 1000,
# so the engine is not the bottleneck) is hit by a real load generator
# directly, through `shoal` (release build, one worker, default policy) and
# through nginx (Debian package, generated config: plain reverse proxy on
# loopback with upstream keepalive). Two passes per target:
#   latency:    CONC_LAT connections at RATE req/s in all (light load): p50/p99
#   throughput: CONC connections, as fast as possible: req/s
# Prints p50/p99 added latency over direct and req/s ratios side by side.
#
# Usage: tests/proxy-bench.sh   (env: DURATION=10 CONC=32 CONC_LAT=4 RATE=500
#        POLICY=cache_aware TOOL=oha|wrk NO_INSTALL=1 NO_BUILD=1)
# Installs what it needs: nginx (apt), oha (`cargo install oha --locked`),
# else wrk (apt). Everything listens on 127.0.0.1; all children are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
CONC=${CONC:-32}
CONC_LAT=${CONC_LAT:-4}
RATE=${RATE:-500}
POLICY=${POLICY:-cache_aware}
TOOL=${TOOL:-}
(( DURATION >= 1 && DURATION <= 20 )) || { echo "DURATION must be 1..20 s" >&2; exit 2; }

say() { echo "proxy-bench: $*" >&2; }
apt_install() {
  [[ -n ${NO_INSTALL:-} ]] && { say "missing $1 and NO_INSTALL is set"; exit 1; }
  say "installing Debian package $1"
  if [[ -z ${APT_UPDATED:-} ]]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || apt_install nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [[ -z $TOOL ]]; then
  if command -v oha >/dev/null || [[ -x $HOME/.cargo/bin/oha ]]; then TOOL=oha
  elif [[ -z ${NO_INSTALL:-} ]] && say "installing oha (cargo install oha --locked, up to 20 min)" &&
       timeout 1200 cargo install oha --locked >/dev/null 2>&1; then TOOL=oha
  else TOOL=wrk; fi
fi
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
[[ $TOOL == wrk ]] && { command -v wrk >/dev/null || apt_install wrk; }
command -v python3 >/dev/null || apt_install python3
command -v curl >/dev/null || apt_install curl

if [[ -z ${NO_BUILD:-} ]]; then
  say "building release binaries"
  cargo build --release -q -p shoal -p shoal-tests --bin mock-engine
fi
BIN=target/release

WORK=$(mktemp -d /tmp/proxy-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

read -r P_ENGINE P_SHOAL P_NGINX < <(python3 - <<'EOF'
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])
EOF
)

wait_http() { # url
  for _ in $(seq 1 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
  say "$1 did not come up"; tail -20 "$WORK"/*.log >&2 || true; exit 1
}

"$BIN/mock-engine" --flavor vllm --engines 1 --host 127.0.0.1 --base-port "$P_ENGINE" \
  --time-scale 1000 --default-max-tokens 1 --stats-capacity 16 >"$WORK/engine.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$P_ENGINE/health"

"$BIN/shoal" --host 127.0.0.1 --port "$P_SHOAL" --worker-urls "http://127.0.0.1:$P_ENGINE" \
  --policy "$POLICY" >"$WORK/shoal.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$P_SHOAL/readiness"

mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
worker_processes auto;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  upstream engine { server 127.0.0.1:$P_ENGINE; keepalive 256; }
  server {
    listen 127.0.0.1:$P_NGINX;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$P_NGINX/health"

BODY='{"model":"mock","messages":[{"role":"user","content":"hello"}],"max_tokens":1}'
printf '%s' "$BODY" >"$WORK/body.json"
cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$BODY'
EOF
for p in $P_ENGINE $P_SHOAL $P_NGINX; do
  curl -fs -o /dev/null -H 'content-type: application/json' -d "$BODY" \
    "http://127.0.0.1:$p/v1/chat/completions" || { say "a test request to port $p failed"; exit 1; }
done

# run NAME PASS URL CONC RATE(0 = unlimited) -> "$WORK/NAME-PASS.json" {rps,p50_us,p99_us,errors}
run() {
  local out="$WORK/$1-$2.json" url=$3 c=$4 q=$5
  local lim=""; [[ $q != 0 ]] && lim=", $q req/s"
  say "$1 $2: ${DURATION}s, $c connections$lim"
  if [[ $TOOL == oha ]]; then
    local rate=(); [[ $q != 0 ]] && rate=(-q "$q")
    "$OHA" -z "${DURATION}s" -c "$c" "${rate[@]}" --no-tui --output-format json -m POST \
      -H 'content-type: application/json' -D "$WORK/body.json" "$url" >"$WORK/raw.json"
    python3 - "$WORK/raw.json" >"$out" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
codes = d.get("statusCodeDistribution", {})
ok = sum(v for k, v in codes.items() if k == "200")
# Requests cut off when the -z duration ends are not failures.
errs = {k: v for k, v in d.get("errorDistribution", {}).items() if "deadline" not in k}
bad = sum(v for k, v in codes.items() if k != "200") + sum(errs.values())
lp = d["latencyPercentiles"]
print(json.dumps({"rps": d["summary"]["requestsPerSec"], "p50_us": lp["p50"] * 1e6,
                  "p99_us": lp["p99"] * 1e6, "errors": bad, "ok": ok}))
EOF
  else
    local rate=(); [[ $q != 0 ]] && say "wrk cannot limit the rate: latency pass runs unthrottled"
    wrk -t 2 -c "$c" -d "${DURATION}s" --latency -s "$WORK/post.lua" "$url" >"$WORK/raw.txt"
    python3 - "$WORK/raw.txt" >"$out" <<'EOF'
import json, re, sys
t = open(sys.argv[1]).read()
def us(v, u): return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
p = {k: us(v, u) for k, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)", t, re.M)}
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
m = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
e = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
bad = (int(m.group(1)) if m else 0) + (sum(map(int, e.groups())) if e else 0)
print(json.dumps({"rps": rps, "p50_us": p["50"], "p99_us": p["99"], "errors": bad}))
EOF
  fi
}

for t in direct shoal nginx; do
  case $t in direct) port=$P_ENGINE;; shoal) port=$P_SHOAL;; nginx) port=$P_NGINX;; esac
  url="http://127.0.0.1:$port/v1/chat/completions"
  run "$t" latency "$url" "$CONC_LAT" "$RATE"
  run "$t" throughput "$url" "$CONC" 0
done

python3 - "$WORK" "$TOOL" "$DURATION" "$CONC" "$CONC_LAT" "$RATE" "$POLICY" <<'EOF'
import json, os, sys
w, tool, dur, conc, cl, rate, policy = sys.argv[1:]
r = {(t, p): json.load(open(os.path.join(w, f"{t}-{p}.json")))
     for t in ("direct", "shoal", "nginx") for p in ("latency", "throughput")}
d = r[("direct", "latency")]
print(f"proxy-bench: {tool}, {dur}s per pass; latency pass {cl} connections at {rate} req/s, "
      f"throughput pass {conc} connections; shoal policy {policy}; {os.cpu_count()} cores (shared, noisy)\n")
print("| target | p50 µs | p99 µs | added p50 µs | added p99 µs | req/s (throughput pass) | req/s vs nginx | errors |")
print("|---|---|---|---|---|---|---|---|")
ng = r[("nginx", "throughput")]["rps"]
for t in ("direct", "shoal", "nginx"):
    l, th = r[(t, "latency")], r[(t, "throughput")]
    add50 = "–" if t == "direct" else f"{l['p50_us'] - d['p50_us']:.0f}"
    add99 = "–" if t == "direct" else f"{l['p99_us'] - d['p99_us']:.0f}"
    print(f"| {t} | {l['p50_us']:.0f} | {l['p99_us']:.0f} | {add50} | {add99} | {th['rps']:.0f} "
          f"| {th['rps'] / ng:.2f} | {l['errors'] + th['errors']} |")
s = r[("shoal", "latency")]
over = s["p99_us"] - d["p99_us"]
ratio = r[("shoal", "throughput")]["rps"] / ng
print(f"\ngoal: shoal p99 overhead {over:.0f} µs over direct (<= 300: {'met' if over <= 300 else 'NOT met'}); "
      f"shoal req/s = {ratio:.2f} x nginx (>= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")
EOF
