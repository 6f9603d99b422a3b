"""The distributions: licence and metadata, the manylinux wheel and the sdist (which carries
libferry's sources), each installed into a fresh virtual environment."""

import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
ROOT = PYTHON_DIR.parent
OFFLINE = bool(os.environ.get("FERRY_TEST_PYTHON_OFFLINE"))

# A host round trip with no numpy: what a fresh environment can do with ferry alone.
ROUND_TRIP = """
import ferry
with ferry.Pool("1MiB", 1) as pool:
    r = pool.reserve(16, "uint8")
    memoryview(r)[:] = bytes(range(16))
    r.commit()
    got = ferry.receive(r.descriptor, rank=0)
    assert bytes(got) == bytes(range(16)), bytes(got)
print("round trip ok", ferry.__file__)
"""


def test_license():
    assert (ROOT / "LICENSE").read_text() == (PYTHON_DIR / "LICENSE").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_metadata():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())["project"]
    assert project["name"] == "ferry-tensors"
    assert project["license"] == {"text": "Apache-2.0"}
    assert project["authors"] == [{"name": "ferry developers"}]
    assert project["scripts"] == {"ferry": "ferry.cli:main"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]


def sh(*cmd, **kwargs):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          **kwargs)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def patchelf_ok():
    """Whether build-wheel finds patchelf >= 0.14.5 (auditwheel's need), its bin/ first."""
    path = os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ["PATH"]])
    try:
        out = subprocess.run(["patchelf", "--version"], capture_output=True, text=True,
                             env={**os.environ, "PATH": path}).stdout
    except OSError:
        return False
    version = tuple(int(x) for x in out.split()[-1].split(".")[:3] if x.isdigit())
    return version >= (0, 14, 5)


def ensure_tools():
    """auditwheel and a recent patchelf in this environment, or skip."""
    try:
        sh(sys.executable, "-m", "auditwheel", "--version")
        if patchelf_ok():
            return
    except AssertionError:
        pass
    if OFFLINE:
        pytest.skip("auditwheel or patchelf >= 0.14.5 is missing and there is no network "
                    "(FERRY_PY_OFFLINE)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "auditwheel",
                           "patchelf"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"cannot install auditwheel and patchelf: {done.stderr[-300:]}")


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    ensure_tools()
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PYTHON": sys.executable}
    sh(PYTHON_DIR / "build-wheel", out, env=env)
    wheels = sorted(out.glob("*.whl"))
    sdists = sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(out.iterdir())
    return wheels[0], sdists[0]


def fresh_venv(path):
    args = ["--system-site-packages"] if OFFLINE else []
    sh(sys.executable, "-m", "venv", *args, path)
    return path / "bin" / "python"


def install_and_round_trip(tmp_path, artifact, *pip_args):
    py = fresh_venv(tmp_path / "venv")
    offline = ["--no-build-isolation", "--no-deps"] if OFFLINE else []
    sh(py, "-m", "pip", "install", "-q", *offline, *pip_args, artifact)
    out = sh(py, "-c", ROUND_TRIP, cwd=tmp_path)  # not the source tree's ferry/
    assert "round trip ok" in out and str(tmp_path / "venv") in out
    out = sh(tmp_path / "venv" / "bin" / "ferry", "version", cwd=tmp_path)
    assert out.startswith("ferry-tensors 0.1.0")


def test_wheel_is_manylinux_and_installs(dists, tmp_path):
    wheel, _ = dists
    assert "-manylinux_" in wheel.name and wheel.name.startswith("ferry_tensors-0.1.0-")
    names = zipfile.ZipFile(wheel).namelist()
    for need in ("ferry/__init__.py", "ferry/py.typed", "ferry/_ferry.pyi", "ferry/cli.py"):
        assert need in names
    assert any(n.startswith("ferry/_ferry.cpython") and n.endswith(".so") for n in names)
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)
    assert any("licenses/LICENSE" in n or n.endswith("dist-info/LICENSE") for n in names), names
    install_and_round_trip(tmp_path, wheel, "--no-deps")


def test_sdist_carries_the_c_sources_and_builds_on_its_own(dists, tmp_path):
    _, sdist = dists
    names = tarfile.open(sdist).getnames()
    top = sdist.name[: -len(".tar.gz")]
    for need in ("vendor/ferry/include/ferry.h", "vendor/ferry/CMakeLists.txt",
                 "vendor/ferry/src/ferry.map", "CMakeLists.txt", "_build/backend.py",
                 "LICENSE", "src/module.c"):
        assert f"{top}/{need}" in names, need
    assert not (PYTHON_DIR / "vendor").exists()  # the copy is gone after the build
    # unpacked away from the repository: FERRY_SOURCE_DIR=.. has no include/ferry.h there
    install_and_round_trip(tmp_path, sdist)
