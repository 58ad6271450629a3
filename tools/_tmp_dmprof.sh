python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -30; exit 1; }
PYTHONPATH=. timeout 400 python3 -m pytest -q tests/ -p no:logging --tb=line -W ignore 2>&1 | grep -v "^DEBUG" | tail -4
PYTHONPATH=. python3 tools/profile_hash_step.py hash hash_in 2>&1 | grep -E "^==|deferred" | cut -c1-250
