#!/usr/bin/env bash
# The console's browser tests (tests/console/) drive Debian's Chromium headless with
# Playwright: install Debian's package when /usr/bin/chromium is missing (no browser download).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo -n"; fi
if command -v apt-get >/dev/null 2>&1; then
  echo "no /usr/bin/chromium: installing Debian's chromium" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  # Debian 12 (bookworm) carries one chromium at a time (its security updates): the version is
  # the archive's, not pinned here; the tests print it.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
else
  echo "error: no /usr/bin/chromium and no apt-get; the console's browser tests need Debian's chromium" >&2
  exit 1
fi
