"""HPwsn benchmarks: run each from the repository root as `python -m bench.NAME`."""
