#!/bin/sh
# Set-up of a fresh machine for kdebug (README, "Install and run"):
#   1. Debian's chromium, for the browser tests of the HTML report (they skip
#      cleanly without it; this step is skipped where apt-get or root is missing);
#   2. torch (the CPU build this project is developed against) and kdebug itself,
#      editable, with its test extras (pytest, Playwright to drive chromium).
set -e
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "kdebug setup: installing Debian's chromium (log: /tmp/kdebug-apt.log)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
        >/tmp/kdebug-apt.log 2>&1; then
      echo "kdebug setup: could not install chromium (see /tmp/kdebug-apt.log); the browser tests will be skipped"
    fi
  else
    echo "kdebug setup: no chromium here and no root apt-get: install Debian's chromium package" \
         "to run the report's browser tests (they are skipped without it)"
  fi
fi
pip install torch==2.13.0
pip install --no-build-isolation -e '.[test]'
