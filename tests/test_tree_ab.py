"""benchmarks/tree_ab.py loads another nqdq tree beside this one, as package ``nqdq_old``.
That is sound only while every import inside ``nqdq`` is relative (an absolute one would run
the already-imported tree's module instead); this tree must stay loadable that way, as the
"old" side of a later A/B."""

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
