"""Digests of DES runs, for showing a refactor or a speed-up changes nothing, bit for bit.

`python -m thunder_mw.lab.des_digest SCENARIO:POLICY[:SEED] ...` runs each main point as
`thunder-mw bench` would and prints one sha256 per run over its metrics and JCTs (wall time
left out); compare the lines printed at two commits.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

from thunder_mw.benchmarks import bench_cli

__all__ = ["digest", "main"]


def digest(spec: str) -> str:
    scenario, jobs, seed = bench_cli.main_jobs(spec)
    started = time.perf_counter()
    _, out = bench_cli.run_job(scenario, jobs[0], None, seed)
    out.pop("wall_s", None)
    text = json.dumps(out, sort_keys=True, default=str)
    took = time.perf_counter() - started
    return f"{hashlib.sha256(text.encode()).hexdigest()[:16]}  {spec}  ({took:.1f} s)"


def main(argv: list[str]) -> int:
    for spec in argv:
        print(digest(spec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
