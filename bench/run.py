"""`make bench`: runs every benchmark that exists and prints its figures.

Each benchmark is a script ``bench/<name>.py`` that prints a human table and writes
``bench-results/<name>.json``. Pass names to run a subset: ``make bench BENCH_ARGS=broker``.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ORDER = ["logpath", "broker", "growth", "failover", "sla", "cluster", "ordered", "delayed", "memory"]


def main(argv: list[str]) -> int:
    here = pathlib.Path(__file__).resolve().parent
    wanted = argv or ORDER
    failed = []
    for name in wanted:
        script = here / f"{name}.py"
        if not script.exists():
            print(f"bench: {name}: not present, skipped")
            continue
        print(f"\n=== bench: {name} ===", flush=True)
        rc = subprocess.call([sys.executable, str(script)], cwd=here.parent)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"bench: failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
