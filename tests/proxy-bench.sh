#!/usr/bin/env bash
# proxy-bench: what does one hop through shoal cost, in CPU and latency, next
# to nginx doing the same job?
#
# Backends (one at a time; each gets its own proxies):
#   fixed   an nginx (1 worker) answering every POST with a fixed ~300-byte
#           chat.completion JSON (p50 ~15 µs direct at c=1): nearly all the
#           cost is the proxy's. It also serves /health and a static vLLM
#           /metrics, so shoal's health checks and load polls work as usual
#   mock    the mock engine, non-streamed, max_tokens 1, time scale 1000
#   stream  the mock engine streaming 64 SSE events per request (max_tokens 64,
#           one token per event, time scale 1e9 so tokens are not paced)
# Targets per backend, interleaved within each round:
#   direct  wrk -> backend
#   nginx   wrk -> nginx reverse proxy (PROXY_THREADS workers, upstream keepalive 256) -> backend
#   LABEL   wrk -> shoal (each build in SHOAL_BINS) -> backend
#   LABEL+mesh   the same through 3 meshed replicas (mTLS); load and CPU on replica 0
# Load: wrk -t1 -cC -dDURATION --latency, POST /v1/chat/completions (a small
# chat body). CPU per request: utime+stime (/proc/PID/stat) of the proxy
# (nginx: master and workers) over the pass / requests completed; the direct
# rows show the backend's. Cells: median (min–max) over the rounds. wrk is
# pinned to the last core when there are 4 or more, else unpinned.
#
# Usage: tests/proxy-bench.sh
#   BIN=/tmp/bins NO_BUILD=1 DURATION=3 ROUNDS=1 tests/proxy-bench.sh
#   MESH=both SHOAL_BINS="before=/tmp/old/shoal after=target/release/shoal" tests/proxy-bench.sh
# Environment:
#   BIN=target/release     where shoal and mock-engine are (setting BIN implies NO_BUILD)
#   NO_BUILD=1             no `cargo build --release` first
#   NO_INSTALL=1           never apt-get install a missing nginx / wrk / curl / python3
#   SHOAL_BINS="shoal=$BIN/shoal"   space-separated LABEL=PATH builds, measured side by side
#   SHOAL_ARGS=""          extra arguments for every shoal
#   PROXY_THREADS=2        nginx worker_processes, and shoal --io-threads (for builds
#                          that have the flag), so both proxies get the same threads
#   POLICY=prefix_affinity shoal --policy (the default)
#   MESH=off               off | on (3 meshed replicas) | both
#   BACKENDS="fixed mock stream"
#   CONCS="8 1"            wrk connections; one table per value (CONC=N means CONCS=N)
#   DURATION=10            seconds per wrk pass, 1..20
#   ROUNDS=5               rounds, 1..60 (targets run in reverse order in even rounds,
#                          so a drift of the host over a round biases no target)
#   WARMUP=1               seconds of unmeasured load per target before the rounds, 0..5
#   IDLE=5                 seconds of idle CPU measured per backend before the load, 0..10
#   OUT=target/proxy-bench.json     every figure, per pass and summarised
#   KEEP_WORK=1            keep the temporary directory (configs, logs, raw wrk output)
# Relative paths are from the repository root. Everything listens on
# 127.0.0.1 on free ports; every child is stopped on exit. The goal lines
# compare each round with the same round's nginx (fixed backend at c=8, and
# the stream backend per SSE event); the CPU ratio is the first.
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=tests/proxy-bench

say() { echo "proxy-bench: $*" >&2; }
die() { say "$*"; exit 1; }
int_in() { # NAME VALUE MIN MAX
  if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < $3 || $2 > $4)); then
    die "$1 must be an integer in $3..$4 (got '$2')"
  fi
}

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
CONCS=${CONCS:-${CONC:-8 1}}
WARMUP=${WARMUP:-1}
IDLE=${IDLE:-5}
POLICY=${POLICY:-prefix_affinity}
MESH=${MESH:-off}
BACKENDS=${BACKENDS:-fixed mock stream}
OUT=${OUT:-target/proxy-bench.json}
SHOAL_ARGS=${SHOAL_ARGS:-}
PROXY_THREADS=${PROXY_THREADS:-2}
int_in PROXY_THREADS "$PROXY_THREADS" 1 64
if [[ -n ${BIN:-} ]]; then NO_BUILD=1; else BIN=target/release; fi
SHOAL_BINS=${SHOAL_BINS:-shoal=$BIN/shoal}
STREAM_TOKENS=64

int_in DURATION "$DURATION" 1 20
int_in ROUNDS "$ROUNDS" 1 60
int_in WARMUP "$WARMUP" 0 5
int_in IDLE "$IDLE" 0 10
read -ra CONC_LIST <<<"$CONCS"
((${#CONC_LIST[@]})) || die "CONCS is empty"
for c in "${CONC_LIST[@]}"; do int_in "CONCS entry" "$c" 1 1024; done
read -ra BACKEND_LIST <<<"$BACKENDS"
((${#BACKEND_LIST[@]})) || die "BACKENDS is empty"
for b in "${BACKEND_LIST[@]}"; do
  [[ $b == fixed || $b == mock || $b == stream ]] || die "BACKENDS: unknown backend '$b' (fixed, mock, stream)"
done
case $MESH in off) MESH_MODES=(off) ;; on) MESH_MODES=(on) ;; both) MESH_MODES=(off on) ;;
  *) die "MESH must be off, on or both (got '$MESH')" ;; esac
read -ra SHOAL_ARGV <<<"$SHOAL_ARGS"

LABELS=()
declare -A SHOAL_PATH=()
for pair in $SHOAL_BINS; do
  [[ $pair == *=* ]] || die "SHOAL_BINS: '$pair' is not LABEL=PATH"
  label=${pair%%=*}
  [[ $label =~ ^[A-Za-z0-9_.-]+$ && $label != direct && $label != nginx ]] ||
    die "SHOAL_BINS: bad label '$label' (letters, digits, _ . -; not direct or nginx)"
  [[ -z ${SHOAL_PATH[$label]:-} ]] || die "SHOAL_BINS: label '$label' given twice"
  LABELS+=("$label")
  SHOAL_PATH[$label]=${pair#*=}
done
((${#LABELS[@]})) || die "SHOAL_BINS is empty"

# --- tools and binaries -------------------------------------------------------
apt_install() {
  [[ -n ${NO_INSTALL:-} ]] && die "missing $1 and NO_INSTALL is set"
  say "installing Debian package $1"
  if [[ -z ${APT_UPDATED:-} ]]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || apt_install nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
command -v wrk >/dev/null || apt_install wrk
command -v python3 >/dev/null || apt_install python3
command -v curl >/dev/null || apt_install curl

if [[ -z ${NO_BUILD:-} ]]; then
  say "building release binaries (cargo build --release -p shoal -p shoal-tests)"
  cargo build --release -q -p shoal -p shoal-tests --bin shoal --bin mock-engine
fi
MOCK=$BIN/mock-engine
[[ -x $MOCK ]] || die "$MOCK is missing (build it, or set BIN)"
for label in "${LABELS[@]}"; do
  [[ -x ${SHOAL_PATH[$label]} ]] || die "shoal build '$label': ${SHOAL_PATH[$label]} is not executable"
done
"$MOCK" --help | grep -q -- --tokens-per-chunk || die "$MOCK has no --tokens-per-chunk (too old?)"

# --- the run's shape ----------------------------------------------------------
TARGETS=(direct nginx)
declare -A T_KIND=([direct]=direct [nginx]=nginx) T_LABEL=() T_MESH=([direct]=off [nginx]=off)
for label in "${LABELS[@]}"; do
  for m in "${MESH_MODES[@]}"; do
    name=$label; [[ $m == on ]] && name=$label+mesh
    TARGETS+=("$name"); T_KIND[$name]=shoal; T_LABEL[$name]=$label; T_MESH[$name]=$m
  done
done

NPROC=$(nproc)
CLK_TCK=$(getconf CLK_TCK)
PIN=()
if ((NPROC >= 4)); then
  PIN=(taskset -c "$((NPROC - 1))"); PINNED="wrk pinned to core $((NPROC - 1))"
else
  PINNED="wrk unpinned ($NPROC cores: proxies, backend and wrk share them)"
fi
NPASS=$((${#BACKEND_LIST[@]} * ROUNDS * ${#CONC_LIST[@]} * ${#TARGETS[@]}))
EXPECT=$((NPASS * (DURATION + 1) + ${#BACKEND_LIST[@]} * (${#TARGETS[@]} * (WARMUP + 1) + IDLE + 5)))
say "${#BACKEND_LIST[@]} backend(s) x ${#TARGETS[@]} targets (${TARGETS[*]}) x concurrency ${CONC_LIST[*]}" \
  "x $ROUNDS round(s) = $NPASS wrk passes of ${DURATION}s; expected total ~$((EXPECT / 60)) min $((EXPECT % 60)) s"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
say "$PINNED; CPU from /proc/PID/stat in 1/$CLK_TCK s ticks; load average now $LOAD_BEFORE"

# --- processes ----------------------------------------------------------------
WORK=$(mktemp -d /tmp/proxy-bench.XXXXXX)
chmod 755 "$WORK" # nginx workers run as nobody
STAGE=() # the processes of the current backend (the exit trap stops them)
stop_pids() { # PID...: TERM (nginx masters stop their workers), then KILL after 2 s
  local p all=() left=() child
  for p in "$@"; do
    kill -0 "$p" 2>/dev/null || continue
    all+=("$p")
    while read -r child; do all+=("$child"); done < <(pgrep -P "$p" || true)
  done
  ((${#all[@]})) || return 0
  kill -TERM "${all[@]}" 2>/dev/null || true
  for _ in $(seq 20); do # shoal drains for --drain-settle-secs (5 s) on TERM: not waited for
    left=()
    for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
    ((${#left[@]})) || break
    sleep 0.1
  done
  if ((${#left[@]})); then kill -KILL "${left[@]}" 2>/dev/null || true; fi
  for p in "$@"; do { wait "$p"; } 2>/dev/null || true; done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  ((${#STAGE[@]})) && stop_pids "${STAGE[@]}"
  if [[ -n ${KEEP_WORK:-} || $rc != 0 ]]; then say "work files kept in $WORK"; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

spawn() { # LOG CMD...: starts CMD in the background; its pid in SPAWNED
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  SPAWNED=$!
  STAGE+=("$SPAWNED")
}
logs_tail() { for f in "$WORK"/*/*.log; do [[ -s $f ]] && { echo "== $f" && tail -5 "$f"; }; done >&2 || true; }
check_alive() {
  local p
  for p in "${STAGE[@]}"; do kill -0 "$p" 2>/dev/null || { logs_tail; die "process $p died"; }; done
}
free_ports() { # NTCP NUDP: distinct free ports on 127.0.0.1, TCP ones first
  # Taken below the kernel's ephemeral range when there is room: a port from
  # that range can be grabbed by any outgoing connection on the machine
  # before our server binds it ("Address already in use").
  python3 - "$1" "$2" <<'EOF'
import random, socket, sys
t, u = map(int, sys.argv[1:])
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
held, ports = [], []
cands = list(range(max(10000, lo - 12000), lo)) if lo > 12000 else []
random.shuffle(cands)
for kind in [socket.SOCK_STREAM] * t + [socket.SOCK_DGRAM] * u:
    while True:
        p = cands.pop() if cands else 0
        if p in ports:
            continue
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            s.close()
            continue
        held.append(s)
        ports.append(s.getsockname()[1])
        break
print(*ports)
EOF
}
wait_http() { # URL
  for _ in $(seq 150); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done
  logs_tail; die "$1 did not come up"
}
wait_meshed() { # URL...: each replica counts all the others
  local u n want=$(($# - 1))
  for u in "$@"; do
    for _ in $(seq 300); do
      n=$(curl -fs "$u/mesh/status" 2>/dev/null | python3 -c \
        'import json, sys; print(sum(1 for m in json.load(sys.stdin).get("members", []) if m.get("counted")))' \
        2>/dev/null) || n=0
      ((n >= want)) && continue 2
      sleep 0.1
    done
    logs_tail; die "$u did not see its $want mesh peers in 30 s"
  done
}

# CPU ticks (utime + stime) of processes; "nginx:PID" means the master and its
# workers; an empty argument counts nothing.
expand_pids() {
  local s
  for s in "$@"; do
    if [[ $s == nginx:* ]]; then echo "${s#nginx:}"; pgrep -P "${s#nginx:}" || true; else echo "$s"; fi
  done
}
cpu_ticks() {
  local total=0 p line rest f
  for p in $(expand_pids "$@"); do
    read -r line <"/proc/$p/stat" 2>/dev/null || continue
    rest=${line##*) } # comm may hold spaces; fields 14, 15 are 11, 12 after it
    read -ra f <<<"$rest"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}
# CPU ticks of one process's threads that are not its I/O threads (shoal-io-*):
# for shoal, the mesh, polls and health checks, apart from serving requests.
side_ticks() {
  local total=0 t line comm rest f
  for t in /proc/"$1"/task/*; do
    read -r line <"$t/stat" 2>/dev/null || continue
    comm=${line#*(}; comm=${comm%)*}
    [[ $comm == shoal-io-* ]] && continue
    rest=${line##*) }
    read -ra f <<<"$rest"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

# --- configs --------------------------------------------------------------------
CHAT_JSON='{"id":"chatcmpl-9f4c2a7e1b3d4e5f","object":"chat.completion","created":1733011200,"model":"mock/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":17,"completion_tokens":9,"total_tokens":26}}'
# Enough for shoal's load poller to detect a vLLM engine and read an idle load.
VLLM_METRICS='# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="mock/Qwen3-8B"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="mock/Qwen3-8B"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="mock/Qwen3-8B"} 0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="mock/Qwen3-8B"} 0
'
PROMPT='[{"role":"user","content":"Say hello in one short sentence, please."}]'
declare -A BODY=(
  [fixed]="{\"model\":\"mock/Qwen3-8B\",\"messages\":$PROMPT,\"max_tokens\":1}"
  [mock]="{\"model\":\"mock/Qwen3-8B\",\"messages\":$PROMPT,\"max_tokens\":1}"
  [stream]="{\"model\":\"mock/Qwen3-8B\",\"messages\":$PROMPT,\"max_tokens\":$STREAM_TOKENS,\"stream\":true}"
)

nginx_head() { # DIR WORKERS: the common part of a generated nginx.conf
  cat <<EOF
daemon off;
worker_processes $2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  # nginx closes a keep-alive connection after 1000 requests by default
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path $1/body;
  proxy_temp_path $1/proxy;
  fastcgi_temp_path $1/fastcgi;
  uwsgi_temp_path $1/uwsgi;
  scgi_temp_path $1/scgi;
EOF
}
start_nginx() { # DIR (holding nginx.conf)
  "$NGINX" -t -q -p "$1" -e "$1/error.log" -c "$1/nginx.conf" || die "bad nginx config $1/nginx.conf"
  spawn "$1/nginx.log" "$NGINX" -p "$1" -e "$1/error.log" -c "$1/nginx.conf"
}

# Mesh certificates, once per build.
if [[ $MESH != off ]]; then
  for label in "${LABELS[@]}"; do
    "${SHOAL_PATH[$label]}" mesh gen-certs --out "$WORK/certs-$label" --nodes a,b,c --force \
      >"$WORK/certs-$label.log" 2>&1 || { cat "$WORK/certs-$label.log" >&2; die "gen-certs failed for $label"; }
  done
fi

# --- per backend: start everything ------------------------------------------------
declare -A T_URL=() T_CPU=()
BACKEND_CPU=""
setup_backend() { # BACKEND
  local b=$1 d="$WORK/$1" ntcp=2 nudp=0 label name m i p_back p_ngx url plist ports=()
  STAGE=()
  mkdir -p "$d"
  for name in "${TARGETS[@]:2}"; do
    if [[ ${T_MESH[$name]} == on ]]; then ntcp=$((ntcp + 3)); nudp=$((nudp + 6)); else ntcp=$((ntcp + 1)); fi
  done
  # $(...) waits for free_ports to exit and release its sockets (a process
  # substitution would not: the engine could then find its port still held)
  plist=$(free_ports "$ntcp" "$nudp")
  read -ra ports <<<"$plist"
  p_back=${ports[0]} p_ngx=${ports[1]}
  local next_tcp=2 next_udp=$ntcp

  case $b in
    fixed)
      mkdir -p "$d/backend"
      {
        nginx_head "$d/backend" 1
        cat <<EOF
  server {
    listen 127.0.0.1:$p_back;
    location = /health { default_type text/plain; return 200 "ok\n"; }
    location = /metrics { default_type text/plain; return 200 '$VLLM_METRICS'; }
    location /v1/loads { return 404; }
    location / { default_type application/json; return 200 '$CHAT_JSON'; }
  }
}
EOF
      } >"$d/backend/nginx.conf"
      start_nginx "$d/backend"
      BACKEND_CPU="nginx:$SPAWNED"
      ;;
    mock)
      spawn "$d/engine.log" "$MOCK" --flavor vllm --engines 1 --host 127.0.0.1 --base-port "$p_back" \
        --time-scale 1000 --default-max-tokens 1 --stats-capacity 16
      BACKEND_CPU=$SPAWNED
      ;;
    stream)
      # time scale 1e9: a 12 ms model step lasts 0 ns, so all 64 tokens are
      # ready at once; one token per SSE event.
      spawn "$d/engine.log" "$MOCK" --flavor vllm --engines 1 --host 127.0.0.1 --base-port "$p_back" \
        --time-scale 1000000000 --tokens-per-chunk 1 --default-max-tokens "$STREAM_TOKENS" --stats-capacity 16
      BACKEND_CPU=$SPAWNED
      ;;
  esac
  local back="http://127.0.0.1:$p_back"
  wait_http "$back/health"
  T_URL[direct]=$back; T_CPU[direct]=""

  mkdir -p "$d/nginx"
  {
    nginx_head "$d/nginx" "$PROXY_THREADS"
    cat <<EOF
  upstream backend {
    server 127.0.0.1:$p_back;
    keepalive 256;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:$p_ngx;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
$([[ $b == stream ]] && echo "      proxy_buffering off;")
    }
  }
}
EOF
  } >"$d/nginx/nginx.conf"
  start_nginx "$d/nginx"
  T_URL[nginx]="http://127.0.0.1:$p_ngx"; T_CPU[nginx]="nginx:$SPAWNED"

  for name in "${TARGETS[@]:2}"; do
    label=${T_LABEL[$name]} m=${T_MESH[$name]}
    local base=(--host 127.0.0.1 --worker-urls "$back" --policy "$POLICY" "${SHOAL_ARGV[@]}")
    # Builds from before --io-threads existed run on tokio's default pool.
    if "${SHOAL_PATH[$label]}" --help 2>/dev/null | grep -q -- --io-threads; then
      base+=(--io-threads "$PROXY_THREADS")
    fi
    if [[ $m == off ]]; then
      spawn "$d/$name.log" "${SHOAL_PATH[$label]}" --port "${ports[next_tcp]}" "${base[@]}"
      T_URL[$name]="http://127.0.0.1:${ports[next_tcp]}"; T_CPU[$name]=$SPAWNED
      next_tcp=$((next_tcp + 1))
      wait_http "${T_URL[$name]}/readiness"
    else
      local names=(a b c) urls=() pid0="" certs="$WORK/certs-$label"
      for i in 0 1 2; do
        local n=${names[i]} peers=() j
        for j in 0 1 2; do ((j != i)) && peers+=("127.0.0.1:${ports[next_udp + 2 * j]}"); done
        spawn "$d/$name-$n.log" "${SHOAL_PATH[$label]}" --port "${ports[next_tcp + i]}" "${base[@]}" \
          --mesh-name "$n" --mesh-host 127.0.0.1 --mesh-advertise-host 127.0.0.1 \
          --mesh-port "${ports[next_udp + 2 * i]}" --mesh-quic-port "${ports[next_udp + 2 * i + 1]}" \
          --mesh-tls-ca "$certs/ca.pem" --mesh-tls-cert "$certs/$n.pem" --mesh-tls-key "$certs/$n-key.pem" \
          --mesh-peer-urls "$(IFS=,; echo "${peers[*]}")"
        [[ -z $pid0 ]] && pid0=$SPAWNED
        urls+=("http://127.0.0.1:${ports[next_tcp + i]}")
      done
      next_tcp=$((next_tcp + 3)); next_udp=$((next_udp + 6))
      for url in "${urls[@]}"; do wait_http "$url/readiness"; done
      wait_meshed "${urls[@]}"
      T_URL[$name]=${urls[0]}; T_CPU[$name]=$pid0
    fi
  done

  # One request through every target: a 200 with the expected body.
  local out
  for name in "${TARGETS[@]}"; do
    out=$(curl -fsS -H 'content-type: application/json' -d "${BODY[$b]}" \
      "${T_URL[$name]}/v1/chat/completions" 2>&1) || { logs_tail; die "$b: a test request to $name failed: $out"; }
    if [[ $b == stream ]]; then
      local nev
      nev=$(grep -c '"content":' <<<"$out" || true)
      ((nev == STREAM_TOKENS)) || die "$b via $name: $nev content events, expected $STREAM_TOKENS"
    else
      [[ $out == *'"choices"'* ]] || die "$b via $name: not a chat completion: ${out:0:200}"
    fi
  done
}

# --- measuring ------------------------------------------------------------------------
PASSES=$WORK/passes.jsonl IDLES=$WORK/idle.jsonl
: >"$PASSES"; : >"$IDLES"
run_wrk() { # URL CONC SECS BACKEND OUTFILE
  PB_BODY=${BODY[$4]} timeout "$(($3 + 10))" "${PIN[@]}" \
    wrk -t1 -c"$2" -d"$3"s --latency -s "$HERE/post.lua" "$1/v1/chat/completions" >"$5" 2>&1 ||
    { cat "$5" >&2; die "wrk failed against $1"; }
}
measure() { # BACKEND CONC ROUND TARGET
  local b=$1 c=$2 r=$3 t=$4 raw="$WORK/$1/wrk-c$2-r$3-$4.txt" p0 p1 b0 b1 res
  check_alive
  local s0=0 s1=0 side=null
  [[ ${T_KIND[$t]} == shoal ]] && s0=$(side_ticks "${T_CPU[$t]}")
  p0=$(cpu_ticks "${T_CPU[$t]}"); b0=$(cpu_ticks "$BACKEND_CPU")
  run_wrk "${T_URL[$t]}" "$c" "$DURATION" "$b" "$raw"
  p1=$(cpu_ticks "${T_CPU[$t]}"); b1=$(cpu_ticks "$BACKEND_CPU")
  [[ ${T_KIND[$t]} == shoal ]] && s1=$(side_ticks "${T_CPU[$t]}") && side=$((s1 - s0))
  res=$(grep -m1 '^PBRESULT ' "$raw") || { cat "$raw" >&2; die "no result from wrk"; }
  res=${res#PBRESULT }
  local proxy=null; [[ -n ${T_CPU[$t]} ]] && proxy=$((p1 - p0))
  echo "${res%\}},\"backend\":\"$b\",\"conc\":$c,\"round\":$r,\"target\":\"$t\",\"proxy_ticks\":$proxy,\"side_ticks\":$side,\"backend_ticks\":$((b1 - b0))}" >>"$PASSES"
  [[ $res =~ \"requests\":([0-9]+),\"duration_us\":([0-9]+) ]]
  local n=${BASH_REMATCH[1]} us=${BASH_REMATCH[2]} ticks=$((b1 - b0)) who=backend
  [[ $proxy != null ]] && ticks=$proxy who=proxy
  [[ $res =~ \"p50_us\":([0-9.]+) ]]
  say "$(awk -v b="$b" -v c="$c" -v r="$r" -v t="$t" -v n="$n" -v us="$us" -v k="$ticks" -v hz="$CLK_TCK" \
    -v p50="${BASH_REMATCH[1]}" -v who="$who" -v R="$ROUNDS" 'BEGIN {
      printf "%-6s c=%-3d round %d/%d %-14s %7.0f req/s  p50 %6.0f µs  %s CPU %6.1f µs/req",
        b, c, r, R, t, n / (us / 1e6), p50, who, k / hz * 1e6 / (n > 0 ? n : 1) }')"
}

for b in "${BACKEND_LIST[@]}"; do
  say "== backend $b: starting"
  setup_backend "$b"
  if ((WARMUP > 0)); then
    for t in "${TARGETS[@]}"; do run_wrk "${T_URL[$t]}" "${CONC_LIST[0]}" "$WARMUP" "$b" "$WORK/$b/warmup-$t.txt"; done
  fi
  if ((IDLE > 0)); then
    sleep 1
    declare -A i0=()
    for t in "${TARGETS[@]}"; do i0[$t]=$(cpu_ticks "${T_CPU[$t]:-$BACKEND_CPU}"); done
    sleep "$IDLE"
    for t in "${TARGETS[@]}"; do
      who=proxy; [[ $t == direct ]] && who=backend
      echo "{\"backend\":\"$b\",\"target\":\"$t\",\"of\":\"$who\",\"secs\":$IDLE,\"ticks\":$(($(cpu_ticks "${T_CPU[$t]:-$BACKEND_CPU}") - i0[$t]))}" >>"$IDLES"
    done
  fi
  for r in $(seq "$ROUNDS"); do
    for c in "${CONC_LIST[@]}"; do
      order=("${TARGETS[@]}")
      if ((r % 2 == 0)); then
        order=()
        for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do order+=("${TARGETS[i]}"); done
      fi
      for t in "${order[@]}"; do measure "$b" "$c" "$r" "$t"; done
    done
  done
  check_alive
  stop_pids "${STAGE[@]}"
  STAGE=()
done

# --- report ---------------------------------------------------------------------------
target_specs=()
for t in "${TARGETS[@]}"; do target_specs+=("$t:${T_KIND[$t]}:${T_LABEL[$t]:-}:${T_MESH[$t]}"); done
bin_specs=()
for label in "${LABELS[@]}"; do bin_specs+=("$label=${SHOAL_PATH[$label]}"); done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$WORK/config.json" "$DURATION" "$ROUNDS" "${CONC_LIST[*]}" "${BACKEND_LIST[*]}" "$POLICY" \
  "$MESH" "$NPROC" "$PINNED" "$CLK_TCK" "${target_specs[*]}" "${bin_specs[*]}" "$SHOAL_ARGS" \
  "$("$NGINX" -v 2>&1)" "$(wrk -v 2>&1 | head -1)" "$STREAM_TOKENS" "$LOAD_BEFORE" "$LOAD_AFTER" <<'EOF'
import json, sys
(out, dur, rounds, concs, backends, policy, mesh, nproc, pinned, tck, targets, bins, sargs,
 nginx_v, wrk_v, tokens, load_before, load_after) = sys.argv[1:]
ts = []
for spec in targets.split():
    name, kind, label, m = spec.split(":")
    ts.append({"name": name, "kind": kind, "label": label or None, "mesh": m == "on"})
json.dump({
    "duration_s": int(dur), "rounds": int(rounds), "concs": [int(c) for c in concs.split()],
    "backends": backends.split(), "policy": policy, "mesh": mesh, "nproc": int(nproc),
    "pinning": pinned, "clk_tck": int(tck), "targets": ts, "shoal_args": sargs,
    "shoal_bins": dict(b.split("=", 1) for b in bins.split()),
    "events": {"fixed": 1, "mock": 1, "stream": int(tokens)},
    "backend_desc": {
        "fixed": "nginx `return 200` with a fixed ~300-byte chat.completion, 1 worker",
        "mock": "mock engine, vllm flavor, max_tokens 1, time scale 1000",
        "stream": f"mock engine, stream: {tokens} SSE events per request, time scale 1e9; "
                  f"CPU per event = CPU per request / {tokens}",
    },
    "tools": {"nginx": nginx_v, "wrk": wrk_v},
    "loadavg": {"before": load_before, "after": load_after},
}, open(out, "w"), indent=1)
EOF
mkdir -p "$(dirname "$OUT")"
echo
echo "proxy-bench: wrk -t1, ${DURATION}s per pass, $ROUNDS round(s), median (min–max); shoal --policy $POLICY," \
  "mesh $MESH; proxies on $PROXY_THREADS thread(s) (nginx workers, shoal --io-threads); $PINNED; CPU in 1/$CLK_TCK s ticks; direct rows: the backend's CPU;" \
  "load average before $LOAD_BEFORE, after $LOAD_AFTER"
python3 "$HERE/report.py" "$WORK/config.json" "$PASSES" "$IDLES" "$OUT"
say "all figures in $OUT"
