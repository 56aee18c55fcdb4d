"""Run fuzz targets as child processes and report each: runs, seconds, coverage, crashes.

``python -m fuzz.campaign --seconds 300 --out bench-results/fuzz`` (``make fuzz``) runs
every target in turn; ``tests/test_fuzz.py`` loads this file by path and runs each for a
few seconds. Each target runs in its own process because ``atheris.Fuzz()`` never
returns, and a crash must not take the caller with it. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)")
_RUNS = re.compile(r"Done (\d+) runs in (\d+) second")
_FINDINGS = ("crash-*", "oom-*", "timeout-*", "leak-*", "slow-unit-*")


@dataclass
class Outcome:
    """One target's run. ``findings``: the inputs libFuzzer wrote (crash, out-of-memory,
    timeout); ``output``: its stderr, which holds the Python traceback of a crash."""

    target: str
    returncode: int
    seconds: float
    runs: int | None = None
    cov: int | None = None
    features: int | None = None
    corpus: int | None = None
    findings: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.findings

    def summary(self) -> str:
        state = "ok" if self.ok else f"FAILED (exit {self.returncode})"
        line = (f"{self.target:<22} {state:<16} runs {self.runs or 0:>9}  "
                f"{self.seconds:6.1f}s  cov {self.cov or 0:>4}  ft {self.features or 0:>5}  "
                f"corpus {self.corpus or 0:>4}  findings {len(self.findings)}")
        for path in self.findings:
            line += f"\n    {path}\n    reproduce: python -m fuzz.run {self.target} {path}"
        return line


def target_names() -> list[str]:
    """The keys of ``TARGETS`` in ``fuzz/targets.py``, read from its source: importing it
    would import the broker, and a collecting test suite would pay for it."""
    tree = ast.parse((ROOT / "fuzz" / "targets.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "TARGETS" and isinstance(node.value, ast.Dict)):
            return [k.value for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    raise LookupError("no TARGETS dict in fuzz/targets.py")


def run_target(target: str, work: Path, *, seconds: float | None = None,
               runs: int | None = None, python: str = sys.executable,
               extra: tuple[str, ...] = (), timeout_s: float = 600.0) -> Outcome:
    """Fuzz ``target`` for ``seconds`` or ``runs`` inputs, keeping its corpus and findings
    in ``work`` (the committed seeds are read too)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "corpus").mkdir(exist_ok=True)
    argv = [python, "-m", "fuzz.run", target, f"-artifact_prefix={work}/",
            "-print_final_stats=1", *extra]
    if seconds is not None:
        argv.append(f"-max_total_time={max(1, round(seconds))}")
    if runs is not None:
        argv.append(f"-runs={runs}")
    argv.append(str(work / "corpus"))
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, check=False)
    out = Outcome(target, done.returncode, time.monotonic() - started, output=done.stderr)
    if m := _RUNS.search(done.stderr):
        out.runs = int(m.group(1))
    for m in _DONE.finditer(done.stderr):
        out.runs, out.cov, out.features, out.corpus = (int(g) for g in m.groups())
    out.findings = sorted(str(p) for pattern in _FINDINGS for p in work.glob(pattern))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=300.0, help="per target")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "fuzz")
    parser.add_argument("targets", nargs="*", help="default: every target")
    args = parser.parse_args()
    names = args.targets or target_names()
    outcomes = []
    for name in names:
        print(f"fuzzing {name} for {args.seconds:g}s ...", flush=True)
        outcome = run_target(name, args.out / name, seconds=args.seconds,
                             timeout_s=args.seconds + 600)
        outcomes.append(outcome)
        print(outcome.summary(), flush=True)
    summary = [{k: v for k, v in asdict(o).items() if k != "output"} for o in outcomes]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\nsummary (cov: coverage counters, ft: features, corpus: inputs kept):")
    print("\n".join(o.summary() for o in outcomes))
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        print(f"\n==== {o.target}: last output ====\n{o.output[-6000:]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
