#!/usr/bin/env bash
# What `make test` needs beyond .venv: Debian's Chromium, which the browser tests
# (tests/browser/) drive through Playwright at /usr/bin/chromium. Playwright never
# downloads a browser here (no `playwright install`): it launches this executable.
#
# Installs it with apt-get when running as root; otherwise stops with the command to run.
# Usage: scripts/install_test_deps.sh   (called by `make test` and `make test-deps`)
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  cat >&2 <<MSG
make test: the browser tests need Debian's Chromium at $CHROMIUM and it is missing.
Install it once as root, then run make test again:
    sudo apt-get update && sudo apt-get install -y chromium
(To run everything except the browser tests meanwhile: .venv/bin/pytest -q -m "not browser")
MSG
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "make test: Chromium is missing at $CHROMIUM and there is no apt-get to install it;" \
       "install a Chromium there (Debian/Ubuntu package 'chromium') and run make test again" >&2
  exit 1
fi

echo "make test: installing Debian's chromium for the browser tests (apt-get update && apt-get install -y chromium)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; then
  echo "make test: 'apt-get update && apt-get install -y chromium' failed (see above);" \
       "the browser tests need Chromium at $CHROMIUM" >&2
  exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
  echo "make test: apt-get installed chromium but $CHROMIUM is still missing" >&2
  exit 1
fi
echo "make test: $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed"
