#!/usr/bin/env bash
# Installs Debian's chromium when it is not in PATH. The browser tests
# (make e2e: e2e/chat, e2e/status) drive it headless through chromedp with a fresh
# profile each; they never download a browser of their own. Safe to run
# again.
set -euo pipefail

if version="$(chromium --version 2>/dev/null)"; then
	echo "ensure-chromium: $version"
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-chromium: chromium is not installed and apt-get is unavailable; install Chromium by hand (or set CHROMIUM to its path)" >&2
	exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "ensure-chromium: chromium is not installed; run this script as root or install sudo" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "ensure-chromium: installing chromium"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-dejavu-core

if ! version="$(chromium --version)"; then
	echo "ensure-chromium: chromium does not run after install" >&2
	exit 1
fi
echo "ensure-chromium: $version"
