#!/bin/bash
# install-browser.sh - headless Chromium and its WebDriver for the browser test (tests/test_browser.py).
#
# Usage: bash scripts/install-browser.sh    (as root; `make test` runs it)
# Installs Debian's chromium and chromium-driver when /usr/bin/chromium or /usr/bin/chromedriver is missing;
# nothing is downloaded at test time. Without root it only says that the browser test will be skipped.
set -euo pipefail

log() { echo "install-browser: $*"; }

[[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
    log "not root and no /usr/bin/chromium + /usr/bin/chromedriver: the browser test will be skipped"
    exit 0
fi
command -v apt-get >/dev/null || {
    log "no apt-get: install Chromium and its chromedriver with your package manager; the browser test will be skipped"
    exit 0
}
log "installing chromium chromium-driver (Debian packages)"
LOG=$(mktemp)
# The package lists of a fresh image may be empty or old: update them only when the install fails.
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >"$LOG" 2>&1; then
    apt-get update -q >>"$LOG" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >>"$LOG" 2>&1 || {
        echo "install-browser: error: apt-get install failed; its log:" >&2
        tail -20 "$LOG" >&2
        exit 1
    }
fi
rm -f "$LOG"
