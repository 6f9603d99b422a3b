"""The ``ferry`` command of the Python package (``python -m ferry``, and the ``ferry`` console
script the wheel installs):

    ferry doctor [--json]     what this machine supports and which backend "auto" picks
    ferry bench [--host] ...  the GPU hand-over benchmark (ferry.bench), or the host one
    ferry version             the versions of the package, libferry, Python, numpy, torch
"""

import argparse as _argparse
import sys as _sys

DISTRIBUTION = "ferry-tensors"


def _doctor(args):
    import ferry

    text = ferry.doctor(json=args.json)
    print(text if text.endswith("\n") else text + "\n", end="")
    return 0


def _module_version(name):
    module = _sys.modules.get(name)
    if module is None:
        try:
            module = __import__(name)
        except Exception:  # not installed, or broken: say so, never fail
            return None
    return getattr(module, "__version__", "?")


def package_version():
    """The installed distribution's version (None when run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def _version(args):
    import platform

    import ferry

    print(f"{DISTRIBUTION} {package_version() or '(not installed)'}")
    print(f"libferry {ferry.version()}")
    print(f"python {platform.python_version()} ({_sys.executable})")
    for name in ("numpy", "torch", "ml_dtypes"):
        print(f"{name} {_module_version(name) or 'not installed'}")
    return 0


def gpu_missing():
    """Why the GPU benchmark cannot run here (None when it can): it needs torch with CUDA
    and a GPU."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return "torch finds no CUDA GPU"
    except Exception as e:  # a broken CUDA set-up
        return f"torch cannot use CUDA ({e})"
    return None


def _bench(args, rest):
    from . import hostbench

    if args.host or "--cpu" in rest:
        return hostbench.main(rest if args.host else [a for a in rest if a != "--cpu"])
    missing = gpu_missing()
    if missing:
        print(f"ferry bench: the GPU benchmark needs torch with CUDA and a GPU ({missing}); "
              f"running the host benchmark instead (ferry bench --host)", file=_sys.stderr)
        return hostbench.main(rest)
    from . import bench

    return bench.main(rest)


def main(argv=None):
    argv = list(_sys.argv[1:] if argv is None else argv)
    ap = _argparse.ArgumentParser(prog="ferry", description="ferry for Python: hand tensors "
                                  "between processes through one bounded pool.")
    ap.add_argument("--version", action="store_true", help="print the versions and exit")
    sub = ap.add_subparsers(dest="command", metavar="doctor|bench|version")
    doctor = sub.add_parser("doctor", help="what this machine supports, which backend "
                            "backend='auto' picks and why")
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    bench = sub.add_parser("bench", add_help=False, help="the hand-over benchmark: GPU "
                           "(python -m ferry.bench --help), or --host for the host pool")
    bench.add_argument("--host", action="store_true")
    bench.add_argument("-h", "--help", action="store_true")
    sub.add_parser("version", help="the versions of the package, libferry and friends")
    args, rest = ap.parse_known_args(argv)
    if args.version or args.command == "version":
        if rest:
            ap.error(f"unrecognized arguments: {' '.join(rest)}")
        return _version(args)
    if args.command == "bench":
        if args.help:
            from . import bench as gpu, hostbench

            print("ferry bench [--host] [OPTIONS]: the GPU benchmark (needs torch and a GPU; "
                  "without them the host one runs), or --host for the host one.\n")
            hostbench.parser().print_help()
            print()
            gpu.parser().print_help()
            return 0
        return _bench(args, rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "doctor":
        return _doctor(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    _sys.exit(main())
