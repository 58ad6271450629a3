python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -30; exit 1; }
PYTHONPATH=. timeout 400 python3 -m pytest -q tests/ -p no:logging --tb=short 2>&1 | grep -v "^DEBUG" | grep -v "warn" | tail -30
PYTHONPATH=. python3 tools/profile_hash_step.py untraced dm hash hash_in record 2>&1 | grep -E "^==|^ +[0-9.]+ ms|tree_clone|tree_hash|call\)|dispatch" | cut -c1-150
