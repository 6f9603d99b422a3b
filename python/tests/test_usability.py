"""Sizes as strings, reprs, the package's namespace and its typing stubs."""

import ast
import pathlib

import numpy as np
import pytest

import ferry
from ferry import _ferry

PACKAGE = pathlib.Path(ferry.__file__).resolve().parent


@pytest.mark.parametrize(
    "text, size",
    [
        ("256MiB", 256 << 20), ("1GiB", 1 << 30), ("512KiB", 512 << 10), ("1.5GB", 1500000000),
        ("4096", 4096), ("64 mib", 64 << 20), ("2kb", 2000), ("1.5MiB", 3 << 19), ("10B", 10),
        (" 1TiB ", 1 << 40), (4096, 4096), (0, 0),
    ],
)  # fmt: skip
def test_parse_size(text, size):
    assert ferry.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "12XB", "1.5", "-1MiB", "1,5MiB", "1.2345B",
                                  "0x10", "256 MiB extra", "nan", "1e6"])
def test_parse_size_refuses_garbage_naming_it(text):
    with pytest.raises(ValueError) as info:
        ferry.parse_size(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [1.5, None, [1], True])
def test_parse_size_refuses_other_types(value):
    with pytest.raises(TypeError):
        ferry.parse_size(value)


def test_pool_takes_sizes_as_strings():
    with ferry.Pool("2MiB", 1) as pool:
        assert pool.size == 2 << 20 and pool.consumers == 1
        assert pool.stats()["capacity"] <= 2 << 20
        d = pool.publish(np.arange(10, dtype=np.int32))
        assert np.from_dlpack(ferry.receive(d, rank=0)).tolist() == list(range(10))
    with pytest.raises(ValueError, match="'lots'"):
        ferry.Pool("lots", 1)
    with pytest.raises(ValueError, match="memory_size must be positive"):
        ferry.Pool("0MiB", 1)


def test_reprs():
    pool = ferry.Pool("1MiB", 2, on_full="none")
    assert repr(pool) == ("ferry.Pool(backend='host', size='1MiB', consumers=2, device=-1, "
                          "on_full='none', closed=False)")
    assert "size=1000000" in repr(ferry.Pool(10**6, 1))
    d = pool.publish(np.zeros((2, 3), np.float32))
    r = ferry.receive(d, rank=0)
    assert repr(r) == ("ferry.Received(shape=(2, 3), dtype='float32', nbytes=24, "
                       "device='cpu', copy)")
    np.from_dlpack(r)
    assert repr(r).endswith("copy, exported)")
    v = ferry.receive(d, rank=1, copy=False)
    assert repr(v).endswith("device='cpu', view)")
    del v
    res = pool.reserve((4,), "bfloat16")
    assert repr(res) == (f"ferry.Reservation(shape=(4,), dtype='bfloat16', nbytes=8, "
                         f"device='cpu', slot={res.descriptor.slot}, state='open')")
    res.cancel()
    assert repr(res).endswith("state='cancelled')")
    pool.close()
    assert repr(pool).endswith("closed=True)")


def test_namespace_exports_only_the_api():
    public = {n for n in vars(ferry) if not n.startswith("_")}
    submodules = {"bench", "cli", "hostbench", "prometheus"}
    assert public - submodules == set(ferry.__all__) - {"__version__"}
    for name in ferry.__all__:
        assert hasattr(ferry, name), name
    for leak in ("sys", "contextlib", "logging", "re"):
        assert not hasattr(ferry, leak)


def _stub_names(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets)
    return tree, names


def test_typing_stub_covers_the_extension():
    assert (PACKAGE / "py.typed").exists()
    tree, names = _stub_names(PACKAGE / "_ferry.pyi")
    module = {n for n in vars(_ferry) if not n.startswith("__")}
    assert module - names == set()
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for cls in ("Pool", "Descriptor", "Received", "Reservation", "Receiver"):
        members = {m.name for m in classes[cls].body if isinstance(m, ast.FunctionDef)}
        actual = {n for n in vars(getattr(_ferry, cls)) if not n.startswith("_")}
        assert actual - members == set(), cls


def test_versions():
    assert ferry.__version__ == ferry.version()
    assert ferry.version().count(".") == 2
