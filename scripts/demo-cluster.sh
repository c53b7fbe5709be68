#!/usr/bin/env bash
# make demo-cluster: one queue shared by three Caddy nodes through Redis.
#
# Starts a private redis-server (installed by ensure-redis.sh if missing)
# on a free port, the mock LLM, and three Caddy nodes whose fair_queue
# share one queue (permits 4, max_wait 10s); then sends a burst of
# streaming chat completions round-robin over the nodes, printing the
# queue depth, requests in flight, granted and rejected every 500ms, and
# ends with a table of the wait per node and the upstream's highest
# concurrency against the permits. Every process it starts is stopped at
# the end, on Ctrl-C too. Takes about 20s.
#
# Environment: RATE (arrivals/s, default 6), DURATION (default 10s),
# TOKENS and TOKEN_DELAY (each answer: 20 tokens of 40ms, so the 4
# permits serve 5 requests/s and a queue builds up), GO (default go).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RATE=${RATE:-6}
DURATION=${DURATION:-10s}
TOKENS=${TOKENS:-20}
TOKEN_DELAY=${TOKEN_DELAY:-40ms}
PERMITS=4
QUEUE=demo
NODES=3

./scripts/ensure-redis.sh >/dev/null
echo "demo: building bin/caddy, bin/mockllm, bin/loadgen"
mkdir -p bin
"$GO" build -o bin/caddy ./cmd/caddy
"$GO" build -o bin/mockllm ./cmd/mockllm
"$GO" build -o bin/loadgen ./cmd/loadgen

work=$(mktemp -d "${TMPDIR:-/tmp}/fair-queue-demo.XXXXXX")
pids=()
stop_all() {
	trap - EXIT INT TERM
	local pid alive
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for _ in $(seq 1 100); do # at most 10s, then force
		alive=0
		for pid in "${pids[@]}"; do
			if kill -0 "$pid" 2>/dev/null; then alive=1; fi
		done
		[ "$alive" -eq 0 ] && break
		sleep 0.1
	done
	for pid in "${pids[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$work"
	echo "demo: stopped redis-server, mockllm and $NODES Caddy nodes"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a port nothing listens on, not handed out before.
used=" "
free_port() {
	local p
	for _ in $(seq 1 100); do
		p=$((20000 + RANDOM % 30000))
		if [[ "$used" != *" $p "* ]] && ! port_open "$p"; then
			used+="$p "
			echo "$p"
			return 0
		fi
	done
	echo "demo: no free port found" >&2
	return 1
}

# wait_port NAME PORT PID LOG: wait (at most 15s) until PORT accepts.
wait_port() {
	for _ in $(seq 1 150); do
		port_open "$2" && return 0
		if ! kill -0 "$3" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "demo: $1 did not start; last lines of $4:" >&2
	tail -n 20 "$4" >&2
	exit 1
}

redis_port=$(free_port)
mock_port=$(free_port)

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
	--dir "$work" >"$work/redis.log" 2>&1 &
pids+=("$!")
wait_port redis-server "$redis_port" "$!" "$work/redis.log"

bin/mockllm -listen "127.0.0.1:$mock_port" -tokens "$TOKENS" -delay "$TOKEN_DELAY" >"$work/mockllm.log" 2>&1 &
pids+=("$!")
wait_port mockllm "$mock_port" "$!" "$work/mockllm.log"

targets=()
for i in $(seq 1 "$NODES"); do
	port=$(free_port)
	cat >"$work/node$i.caddy" <<EOF
{
	admin off
	persist_config off
	auto_https off
	grace_period 2s
}

http://127.0.0.1:$port {
	bind 127.0.0.1
	fair_queue {
		name $QUEUE
		permits $PERMITS
		max_wait 10s
		redis {
			url redis://127.0.0.1:$redis_port/0
		}
	}
	reverse_proxy 127.0.0.1:$mock_port {
		flush_interval -1
	}
}
EOF
	bin/caddy run --config "$work/node$i.caddy" --adapter caddyfile >"$work/node$i.log" 2>&1 &
	pids+=("$!")
	wait_port "Caddy node $i" "$port" "$!" "$work/node$i.log"
	targets+=("http://127.0.0.1:$port")
done

echo
echo "demo: redis-server 127.0.0.1:$redis_port, mockllm 127.0.0.1:$mock_port ($TOKENS tokens x $TOKEN_DELAY per answer)"
echo "demo: $NODES Caddy nodes sharing queue '$QUEUE' (permits $PERMITS, max_wait 10s): ${targets[*]}"
echo "demo: sending $RATE streaming requests/s for $DURATION, round-robin over the nodes"
echo

IFS=,
bin/loadgen -targets "${targets[*]}" -rate "$RATE" -d "$DURATION" -stream -timeout 30s \
	-progress -redis "127.0.0.1:$redis_port" -queue "$QUEUE" \
	-upstream-stats "http://127.0.0.1:$mock_port/stats" -permits "$PERMITS" -wait-table
unset IFS
