#!/usr/bin/env bash
# make demo-cluster: one queue shared by three Caddy nodes through Redis,
# in front of a pool of three mock LLM replicas of different sizes.
#
# Starts a private redis-server (installed by ensure-redis.sh if missing)
# on a free port, three mock LLM replicas (bin/mockllm) of 1, 2 and 3
# permits, and three Caddy nodes whose fair_queue share one queue over
# that pool: an `upstream 127.0.0.1:<port> <permits>` line per replica
# (no `permits` line: the queue's permits are the sum, 6), max_wait 10s,
# and `reverse_proxy { dynamic fair_queue }` sending each request to the
# replica its permit was granted on. Then it sends a burst of streaming
# chat completions round-robin over the nodes, printing every 500ms the
# queue depth, requests in flight, granted and rejected, and each
# replica's requests in flight over its permits ("replicas 1/1 2/2 3/3
# (max 1 2 3)"); it ends with a table of the wait per node and, per
# replica, its highest concurrency against its permits (exit 1 if any
# replica ran more requests at once than its permits, across the three
# nodes). Every process it starts is stopped at the end, on Ctrl-C too.
# Takes about 20s.
#
# Environment: RATE (arrivals/s, default 9), DURATION (default 10s),
# TOKENS and TOKEN_DELAY (each answer: 20 tokens of 40ms, so the 6
# permits serve 6/0.8s = 7.5 requests/s and a queue builds up), GO
# (default go).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RATE=${RATE:-9}
DURATION=${DURATION:-10s}
TOKENS=${TOKENS:-20}
TOKEN_DELAY=${TOKEN_DELAY:-40ms}
REPLICA_PERMITS=(1 2 3) # one mock replica per entry
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
	echo "demo: stopped redis-server, ${#REPLICA_PERMITS[@]} mockllm replicas and $NODES Caddy nodes"
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

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
	--dir "$work" >"$work/redis.log" 2>&1 &
pids+=("$!")
wait_port redis-server "$redis_port" "$!" "$work/redis.log"

# The replicas: upstream lines of the Caddyfile, /stats URLs and permits
# (comma-separated) for loadgen.
upstreams=""
stats=()
replicas=()
for i in "${!REPLICA_PERMITS[@]}"; do
	n=$((i + 1))
	port=$(free_port)
	bin/mockllm -listen "127.0.0.1:$port" -tokens "$TOKENS" -delay "$TOKEN_DELAY" >"$work/mockllm$n.log" 2>&1 &
	pids+=("$!")
	wait_port "mockllm replica $n" "$port" "$!" "$work/mockllm$n.log"
	upstreams+="		upstream 127.0.0.1:$port ${REPLICA_PERMITS[$i]}"$'\n'
	stats+=("http://127.0.0.1:$port/stats")
	replicas+=("127.0.0.1:$port (permits ${REPLICA_PERMITS[$i]})")
done
total_permits=0
for p in "${REPLICA_PERMITS[@]}"; do total_permits=$((total_permits + p)); done

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
${upstreams}		max_wait 10s
		redis {
			url redis://127.0.0.1:$redis_port/0
		}
	}
	reverse_proxy {
		dynamic fair_queue
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
echo "demo: redis-server 127.0.0.1:$redis_port"
echo "demo: ${#REPLICA_PERMITS[@]} mockllm replicas ($TOKENS tokens x $TOKEN_DELAY per answer): ${replicas[*]}"
echo "demo: $NODES Caddy nodes sharing queue '$QUEUE' over that pool (permits $total_permits, max_wait 10s): ${targets[*]}"
echo "demo: sending $RATE streaming requests/s for $DURATION, round-robin over the nodes"
echo

IFS=,
bin/loadgen -targets "${targets[*]}" -rate "$RATE" -d "$DURATION" -stream -timeout 30s \
	-progress -redis "127.0.0.1:$redis_port" -queue "$QUEUE" \
	-upstream-stats "${stats[*]}" -permits "${REPLICA_PERMITS[*]}" -wait-table
unset IFS
