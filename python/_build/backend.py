"""The package's build backend: scikit-build-core, with one addition for sdists.

The extension links libferry, whose C sources live in the repository around python/, outside
the project folder an sdist is made of. build_sdist copies them into vendor/ferry first (git
ignores it; pyproject.toml's sdist.include takes it in) and removes the copy afterwards, so an
sdist builds on its own: CMakeLists.txt uses vendor/ferry when FERRY_SOURCE_DIR (default: the
parent folder) has no include/ferry.h. Everything else is scikit-build-core's.
"""

import os
import shutil

from scikit_build_core import build as _skbuild
from scikit_build_core.build import (  # noqa: F401  (the PEP 517 hooks, unchanged)
    build_editable,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
_VENDOR = os.path.join(_HERE, "vendor", "ferry")

# What add_subdirectory() of the repository root needs: its CMakeLists.txt and every path that
# one refers to (missing ones are skipped: an older or newer tree may lack some).
_PARTS = ["CMakeLists.txt", "LICENSE", "include", "src", "bench", "cmake", "tools"]


def _ignore(folder, names):
    return [n for n in names if n == "__pycache__" or n.endswith((".o", ".pyc"))]


def _vendor(root):
    shutil.rmtree(_VENDOR, ignore_errors=True)
    os.makedirs(_VENDOR)
    for part in _PARTS:
        src = os.path.join(root, part)
        dst = os.path.join(_VENDOR, part)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=_ignore)
        elif os.path.isfile(src):
            shutil.copy2(src, dst)
    for name in os.listdir(root):  # templates of the top-level build (ferry.pc.in, ...)
        if name.endswith(".in") and os.path.isfile(os.path.join(root, name)):
            shutil.copy2(os.path.join(root, name), os.path.join(_VENDOR, name))


def build_sdist(sdist_directory, config_settings=None):
    root = os.path.dirname(_HERE)
    if not os.path.isfile(os.path.join(root, "include", "ferry.h")):
        # An sdist made from an sdist: vendor/ferry is there already.
        if not os.path.isfile(os.path.join(_VENDOR, "include", "ferry.h")):
            raise RuntimeError("ferry's C sources were not found (neither ../include/ferry.h "
                               "nor vendor/ferry): build the sdist from the repository")
        return _skbuild.build_sdist(sdist_directory, config_settings)
    _vendor(root)
    try:
        return _skbuild.build_sdist(sdist_directory, config_settings)
    finally:
        shutil.rmtree(os.path.dirname(_VENDOR), ignore_errors=True)
