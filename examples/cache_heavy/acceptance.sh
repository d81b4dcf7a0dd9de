set -x
date -u; uptime
taskset -c 0 python examples/cache_heavy/truth.py --gather 8000 --rounds 150 --block 10 --seed 1
date -u; uptime
taskset -c 0 harness run examples/cache_heavy/acceptance.yaml
date -u; uptime
taskset -c 0 python examples/cache_heavy/truth.py --gather 8000 --rounds 150 --block 10 --seed 2
date -u; uptime
