#!/usr/bin/env bash
# Installs redis-server, and redis-cli (redis-tools), from the
# distribution's packages if either is not in PATH. The tests start their
# own redis-server processes on free ports (internal/redistest), Sentinels
# included (redis-server --sentinel), and join test Clusters with
# redis-cli --cluster create; they never use the system service, so
# whether the package started one on 6379 does not matter. Safe to run
# again.
set -euo pipefail

if version="$(redis-server --version 2>/dev/null)" && command -v redis-cli >/dev/null 2>&1; then
	echo "ensure-redis: $version"
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-redis: redis-server or redis-cli is not installed and apt-get is unavailable; install Redis (>= 7) by hand" >&2
	exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "ensure-redis: redis-server or redis-cli is not installed; run this script as root or install sudo" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "ensure-redis: installing redis-server and redis-tools"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server redis-tools

if ! version="$(redis-server --version)" || ! command -v redis-cli >/dev/null 2>&1; then
	echo "ensure-redis: redis-server or redis-cli does not run after install" >&2
	exit 1
fi
echo "ensure-redis: $version"
