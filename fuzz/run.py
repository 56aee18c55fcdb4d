"""Run one fuzz target under atheris (libFuzzer): ``python -m fuzz.run TARGET [flags] [dirs]``
from the repository root.

``flags`` are libFuzzer's (``-runs=N``, ``-max_total_time=S``, ``-seed=N``, ...). Without
a corpus directory the run keeps what it finds in ``.understudy/fuzz/TARGET/corpus``; the
committed seeds (``fuzz/corpus/TARGET``) are always read, never written. Crash files go to
``.understudy/fuzz/TARGET/`` unless ``-artifact_prefix=`` says otherwise. Given files
instead of directories, it runs just those inputs: ``python -m fuzz.run frames
crash-1234`` reproduces a crash and prints its traceback. ``--list`` names the targets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "corpus"
WORK = ROOT / ".understudy" / "fuzz"

with atheris.instrument_imports(include=["understudy_broker"]):
    from fuzz.targets import TARGETS


def libfuzzer_argv(target: str, args: list[str]) -> list[str]:
    """libFuzzer's argv for ``target``: the caller's flags, default artifact and timeout
    flags, and the corpus directories (the seeds last, so nothing is written there)."""
    flags = [a for a in args if a.startswith("-")]
    paths = [a for a in args if not a.startswith("-")]
    prefix = next((f for f in flags if f.startswith("-artifact_prefix=")), None)
    if prefix is None:
        prefix = f"-artifact_prefix={WORK / target}/"
        flags.append(prefix)
    Path(prefix.partition("=")[2]).parent.mkdir(parents=True, exist_ok=True)
    if not any(f.startswith("-timeout=") for f in flags):
        flags.append("-timeout=20")  # one input hanging this long is a finding too
    if not any(f.startswith("-rss_limit_mb=") for f in flags):
        flags.append("-rss_limit_mb=1536")  # an announced size allocated is a finding
    if paths and all(Path(x).is_file() for x in paths):
        return [sys.argv[0], *flags, *paths]  # reproduce: run exactly these inputs
    if not paths:
        paths = [str(WORK / target / "corpus")]
        Path(paths[0]).mkdir(parents=True, exist_ok=True)
    seeds = SEEDS / target
    if seeds.is_dir():
        paths.append(str(seeds))
    return [sys.argv[0], *flags, *paths]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "--list"):
        print(__doc__)
        print("targets:", " ".join(TARGETS))
        return
    target = argv[1]
    if target not in TARGETS:
        raise SystemExit(f"unknown target {target!r}; targets: {' '.join(TARGETS)}")
    atheris.Setup(libfuzzer_argv(target, argv[2:]), TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
