"""The PySpark jobs: each module has extract / transform / load / main and imports no Django.

`JOBS` is their order in a run; `spark-submit spark/jobs/<name>.py --since ... --until ...` runs
one alone.
"""

JOBS = ("traffic", "latency", "consumer_health", "top_n", "sizes", "regressions")
