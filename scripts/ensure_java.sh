#!/usr/bin/env bash
# PySpark (pipeline/) needs a Java runtime; install Debian's when none is present.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo -n"; fi
if command -v apt-get >/dev/null 2>&1; then
  echo "no java found: installing openjdk-17-jre-headless" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
else
  echo "warning: no java and no apt-get; the PySpark pipeline will not run" >&2
fi
