"""benchmarks/tree_ab.py loads another nqdq tree beside this one, as package ``nqdq_old``.
That is sound only while every import inside ``nqdq`` is relative (an absolute one would run
the already-imported tree's module instead); this tree must stay loadable that way, as the
"old" side of a later A/B. With ``--env NAME=OLD,NEW`` it loads this tree twice, each import
under its own value of the setting."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import tree_ab  # noqa: E402


def test_nqdq_has_no_absolute_self_import():
    assert tree_ab.absolute_imports(ROOT / "nqdq") == []


def test_absolute_imports_are_found(tmp_path):
    pkg = tmp_path / "nqdq"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("import os\n\n    from nqdq.formats import E4M3\nimport nqdqx\n")
    (pkg / "a.py").write_text("import nqdq\n")
    found = tree_ab.absolute_imports(pkg)
    assert [(Path(f).relative_to(pkg).as_posix(), line) for f, line in found] == [("a.py", 1), ("sub/__init__.py", 3)]


def test_a_tree_loaded_beside_nqdq_is_its_own_package():
    import nqdq

    twin = tree_ab.load_tree(ROOT, "nqdq_twin")
    try:
        assert twin is not nqdq and twin.quantize is not nqdq.quantize
        mods = {k: m for k, m in sys.modules.items() if k.startswith("nqdq_twin.")}
        assert {"nqdq_twin.api", "nqdq_twin.schemes", "nqdq_twin.reference.quantize"} <= set(mods)
        assert all(Path(m.__file__).resolve() == Path(sys.modules["nqdq" + k[9:]].__file__).resolve()
                   for k, m in mods.items() if "nqdq" + k[9:] in sys.modules)  # (the same files, other modules)
        assert sys.modules["nqdq_twin.schemes"].Scheme is not sys.modules["nqdq.schemes"].Scheme
        x = np.random.default_rng(1).standard_normal((4, 96)).astype(np.float32)
        a, b = nqdq.quantize(x, "mxfp4"), twin.quantize(x, "mxfp4")
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    finally:
        for k in [k for k in sys.modules if k == "nqdq_twin" or k.startswith("nqdq_twin.")]:
            del sys.modules[k]


def test_a_directory_without_nqdq_is_refused(tmp_path):
    """(spec_from_file_location gives a spec for a missing file: the check must come first,
    before an empty scan for absolute imports passes it)"""
    with pytest.raises(SystemExit, match="no nqdq/__init__.py there"):
        tree_ab.load_tree(tmp_path, "nqdq_missing")
    assert "nqdq_missing" not in sys.modules


def _drop(name):
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[k]


def test_env_sets_and_restores(monkeypatch):
    monkeypatch.delenv("NQDQ_TREE_AB_PROBE", raising=False)
    with tree_ab.env("NQDQ_TREE_AB_PROBE", "0"):
        assert os.environ["NQDQ_TREE_AB_PROBE"] == "0"
        with tree_ab.env("NQDQ_TREE_AB_PROBE", "1"):
            assert os.environ["NQDQ_TREE_AB_PROBE"] == "1"
        assert os.environ["NQDQ_TREE_AB_PROBE"] == "0"
    assert "NQDQ_TREE_AB_PROBE" not in os.environ
    with tree_ab.env(None, None):  # --old: no setting
        pass
    assert tree_ab.parse_env("NQDQ_FAST_LAUNCH=0,1") == ("NQDQ_FAST_LAUNCH", {"old": "0", "new": "1"})
    for bad in ("NQDQ_FAST_LAUNCH=0", "=0,1", "NQDQ_FAST_LAUNCH=0,1,0"):
        with pytest.raises(SystemExit, match="NAME=OLD,NEW"):
            tree_ab.parse_env(bad)


def test_a_tree_imports_under_the_setting():
    """--env: the twin tree imports under the setting (NQDQ_GPU_BACKEND, read at import: a
    value it refuses fails the twin's import), this tree's modules keep theirs."""
    import nqdq.gpu.runtime.backend as backend

    try:
        with tree_ab.env("NQDQ_GPU_BACKEND", "no-such-backend"):
            with pytest.raises(ValueError, match="no-such-backend"):
                tree_ab.load_tree(ROOT, "nqdq_envtwin")
        assert backend.GPU_BACKEND in backend.BACKENDS
    finally:
        _drop("nqdq_envtwin")


def test_env_mode_runs_on_the_cpu(capsys):
    try:
        tree_ab.main(["--env", "NQDQ_FAST_LAUNCH=0,1", "--cpu", "--schemes", "fp8_row", "--rows", "4", "--cols", "64",
                      "--rounds", "2", "--calls", "3"])
    finally:
        _drop("nqdq_old")
    out = capsys.readouterr().out
    assert "with NQDQ_FAST_LAUNCH=0" in out and "with NQDQ_FAST_LAUNCH=1" in out
    assert "fp8_row: codes and scales identical in both trees: True" in out
    assert "| fp8_row |" in out
