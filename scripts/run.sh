#!/usr/bin/env bash
# make run: builds Caddy with the fair_queue plugin and the mock LLM, starts
# the mock on 127.0.0.1:8081 and Caddy with Caddyfile.example (listening on
# :8080), prints what to send, and stops both on Ctrl-C. Needs nothing but
# Go: Caddyfile.example uses the in-process queue.
#
# Environment: CONFIG (default Caddyfile.example), GO (default go),
# MOCK_TOKENS / MOCK_DELAY (the mock's answer: 8 tokens, 50ms each).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
CONFIG=${CONFIG:-Caddyfile.example}
MOCK_ADDR=127.0.0.1:8081
MOCK_TOKENS=${MOCK_TOKENS:-8}
MOCK_DELAY=${MOCK_DELAY:-50ms}
CADDY_PORT=8080
LOG_DIR=bin/run

# port_open PORT: whether something accepts connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

[ -f "$CONFIG" ] || { echo "run: $CONFIG not found" >&2; exit 1; }
for port in 8081 "$CADDY_PORT"; do
	if port_open "$port"; then
		echo "run: port $port is already in use; stop what listens there first" >&2
		exit 1
	fi
done
if grep -Eq '^[[:space:]]*redis([[:space:]]|$)' "$CONFIG" && ! port_open 6379; then
	echo "run: warning: $CONFIG names a redis block but nothing listens on 127.0.0.1:6379" >&2
fi

echo "run: building bin/caddy and bin/mockllm"
mkdir -p bin "$LOG_DIR"
"$GO" build -o bin/caddy ./cmd/caddy
"$GO" build -o bin/mockllm ./cmd/mockllm

pids=()
stop_all() {
	trap - EXIT INT TERM
	local pid
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	# Bounded wait (10s), then force.
	for _ in $(seq 1 100); do
		local alive=0
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
	echo "run: stopped"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

bin/mockllm -listen "$MOCK_ADDR" -tokens "$MOCK_TOKENS" -delay "$MOCK_DELAY" >"$LOG_DIR/mockllm.log" 2>&1 &
pids+=("$!")
bin/caddy run --config "$CONFIG" --adapter caddyfile >"$LOG_DIR/caddy.log" 2>&1 &
pids+=("$!")

# Wait (at most 15s) for both to listen.
for _ in $(seq 1 150); do
	if port_open 8081 && port_open "$CADDY_PORT"; then break; fi
	for pid in "${pids[@]}"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "run: a process exited at startup; last lines of its log:" >&2
			tail -n 20 "$LOG_DIR/mockllm.log" "$LOG_DIR/caddy.log" >&2
			exit 1
		fi
	done
	sleep 0.1
done
if ! port_open "$CADDY_PORT"; then
	echo "run: Caddy did not listen on :$CADDY_PORT within 15s; see $LOG_DIR/caddy.log" >&2
	tail -n 20 "$LOG_DIR/caddy.log" >&2
	exit 1
fi

cat <<EOF

  mock LLM   http://$MOCK_ADDR   ($MOCK_TOKENS tokens, $MOCK_DELAY each; GET /stats shows its concurrency)
  Caddy      http://localhost:$CADDY_PORT   (config $CONFIG)
  logs       $LOG_DIR/caddy.log, $LOG_DIR/mockllm.log

Open http://localhost:$CADDY_PORT/ in a browser: a chat page that streams its
answers and shows its place in the queue while it waits.

Send a plain and a streaming chat completion:

  curl localhost:$CADDY_PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"mock","messages":[{"role":"user","content":"hi"}]}'

  curl -N localhost:$CADDY_PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"mock","stream":true,"messages":[{"role":"user","content":"hi"}]}'

Queue some: run more at once than the permits and watch the upstream never exceed them:

  for i in \$(seq 12); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\n' localhost:$CADDY_PORT/v1/chat/completions -d '{"model":"mock"}' & done; wait
  curl -s $MOCK_ADDR/stats

Press Ctrl-C to stop both.
EOF

# Returns when either process exits (or on Ctrl-C, through the trap).
set +e
wait -n "${pids[@]}"
status=$?
set -e
echo "run: a process exited (status $status); last lines of its log:" >&2
tail -n 20 "$LOG_DIR/mockllm.log" "$LOG_DIR/caddy.log" >&2
exit 1
