#!/usr/bin/env bash
# Installs HAProxy from the distribution's packages if it is not in PATH.
# bench/ (make bench) runs it as the reference queue: `server ...
# maxconn N` + `timeout queue`, on a free loopback port; the package's own
# service, if it starts one, is not used. Safe to run again.
set -euo pipefail

# haproxy -v prints several lines; take the first without a pipe (head
# closing it early would fail the check under pipefail).
if out="$(haproxy -v 2>/dev/null)" && [ -n "$out" ]; then
	echo "ensure-haproxy: ${out%%$'\n'*}"
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-haproxy: haproxy is not installed and apt-get is unavailable; install haproxy by hand" >&2
	exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "ensure-haproxy: haproxy is not installed; run this script as root or install sudo" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "ensure-haproxy: installing haproxy"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y haproxy

if ! out="$(haproxy -v)"; then
	echo "ensure-haproxy: haproxy does not run after install" >&2
	exit 1
fi
echo "ensure-haproxy: ${out%%$'\n'*}"
