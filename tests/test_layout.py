"""Guards for the repository layout that keep Python's stdlib intact."""

from __future__ import annotations

import importlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
STDLIB_NAMES = {"operator", "queue", "select", "socket", "struct", "logging", "types",
                "signal", "test", "code"}


def test_no_package_shadows_stdlib_operator() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists(), (
        "operator/__init__.py would shadow the standard-library operator module"
    )
    import operator as op

    assert op.__file__ is not None
    assert "site-packages" not in op.__file__
    assert hasattr(op, "itemgetter")


def test_top_level_folders_are_not_packages() -> None:
    for folder in ("operator", "broker_image", "spark_jobs", "harness", "crds", "charts", "e2e"):
        assert (ROOT / folder).is_dir(), folder
        assert not (ROOT / folder / "__init__.py").exists(), folder


def test_no_module_named_after_stdlib_inside_packages() -> None:
    for src in ROOT.glob("*/src/understudy_*"):
        for path in src.rglob("*.py"):
            assert path.stem not in STDLIB_NAMES, f"{path} shadows a stdlib module name"
        for path in src.rglob("*"):
            if path.is_dir():
                assert path.name not in STDLIB_NAMES, f"{path} shadows a stdlib package name"


def test_packages_import() -> None:
    for name in ("understudy_broker", "understudy_operator", "understudy_spark", "understudy_harness"):
        assert importlib.import_module(name).__doc__


def test_operator_folder_holds_no_tests() -> None:
    # pytest's importlib mode names a test file operator/tests/test_x.py "operator.tests.test_x"
    # and imports the folder operator/ as a namespace package called "operator", replacing the
    # standard-library module for the rest of the run. Operator tests live in tests/.
    assert not list((ROOT / "operator").rglob("test_*.py"))
