"""Coverage-guided fuzzing (atheris) of the wire codec, the replication protocol and the
record walker, and a mutation fuzzer for a live broker over TCP (docs/fuzzing.md).

Run a target with ``python -m fuzz.run TARGET [libFuzzer flags]`` from the repository
root; ``make fuzz`` runs every one. This package imports nothing at import time, so
:mod:`fuzz.run` can instrument the broker's modules before :mod:`fuzz.targets` loads them.
"""
