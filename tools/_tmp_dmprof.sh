python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -30; exit 1; }
PYTHONPATH=. timeout 400 python3 -m pytest -q tests/test_gpu_hashes.py tests/test_gpu_batching.py -p no:logging --tb=short -W ignore 2>&1 | grep -v "^DEBUG" | tail -4
PYTHONPATH=. python3 tools/profile_hash_step.py hash hash_in 2>&1 | grep -E "^==|deferred" | cut -c1-250
mkdir -p $OUT; PYTHONPATH=. python3 benchmarks/bench_hash.py --device cuda --rounds 5 --json $OUT/hash_cuda_h100.json 2>&1 | grep -v -i warn | tail -30
