"""A stand-in for the parts of torch that ferry reads (python/src/torch.c), for the
fake-driver tests: ferry looks torch up in sys.modules once the program imported it, so a
worker that installs this module instead exercises the fast path and torch=True's allocations
without torch or a GPU. Tensors are numpy arrays presented as CUDA memory (the fake driver's
memory is host memory; device=None: CPU tensors) and count the DLPack exports they are asked
for; torch.empty records what it made and on which current stream."""

import contextlib
import sys
import types

import numpy as np

from fakecuda import CudaLike


class DType:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


DTYPES = {}
strided = object()
CURRENT_STREAM = {}  # device -> raw stream handle (0: the legacy default stream)
CURRENT_DEVICE = [0]  # torch's current CUDA device


class Tensor:
    def __init__(self, array, device=0, requires_grad=False, conj=False, contiguous=True):
        self._source = CudaLike(array, device) if device is not None else np.array(array)
        self.array = self._source.array if device is not None else self._source
        self.device_index = device
        self.is_cuda = device is not None
        self.requires_grad = requires_grad
        self.layout = strided
        self.dtype = DTYPES.setdefault(self.array.dtype.name, DType(self.array.dtype.name))
        self.shape = tuple(self.array.shape)
        self._conj = conj
        self._contiguous = contiguous  # what is_contiguous says (the data is C-ordered)
        self.dlpack_streams = []  # the stream argument of every __dlpack__ call
        self.export_devices = []  # torch's current device at every __dlpack__ call

    def is_contiguous(self):
        return self._contiguous

    def is_conj(self):
        return self._conj

    def is_neg(self):
        return False

    def get_device(self):
        return -1 if self.device_index is None else self.device_index

    def data_ptr(self):
        return self.array.ctypes.data

    def __dlpack_device__(self):
        return self._source.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None):
        self.dlpack_streams.append(stream)
        self.export_devices.append(CURRENT_DEVICE[0])
        if self.device_index is None:
            return self._source.__dlpack__(max_version=max_version)
        return self._source.__dlpack__(stream=stream, max_version=max_version)


def _current_raw_stream(device):
    return CURRENT_STREAM.get(device, 0)


def _get_device():
    return CURRENT_DEVICE[0]


def _set_device(device):
    CURRENT_DEVICE[0] = device


EMPTIES = []  # (shape, dtype name, device, torch's current stream then) of every torch.empty


def empty(shape, dtype=None, device=None):
    index = None if device in (None, "cpu") else int(device)
    EMPTIES.append((tuple(shape), dtype.name, index, CURRENT_STREAM.get(index, 0)))
    return Tensor(np.empty(shape, dtype.name), device=index)


def from_dlpack(obj):
    """Consumes obj's tensor as torch would, into a Tensor of its own (a copy here)."""
    from fakecuda import read_dlpack

    info = read_dlpack(obj, max_version=(1, 0))
    code, bits, _ = info["dtype"]
    kind = {0: "int", 1: "uint", 2: "float", 6: "bool"}[code]
    dt = np.dtype("bool" if kind == "bool" else f"{kind}{bits}")
    array = np.frombuffer(info["data"], dt).reshape(info["shape"]).copy()
    device = info["device"][1] if info["device"][0] == 2 else None
    t = Tensor(array, device=device)
    t.from_dlpack_info = info
    return t


def install():
    """Makes this module the process's torch (and torch._C, torch.cuda)."""
    torch = types.ModuleType("torch")
    torch_c = types.ModuleType("torch._C")
    torch_c._cuda_getCurrentRawStream = _current_raw_stream
    torch_c._cuda_getDevice, torch_c._cuda_setDevice = _get_device, _set_device
    cuda = types.SimpleNamespace(current_device=lambda: 0,
                                 device=lambda _: contextlib.nullcontext())
    torch.Tensor, torch.strided, torch._C, torch.cuda = Tensor, strided, torch_c, cuda
    torch.dtype, torch.empty, torch.from_dlpack = DType, empty, from_dlpack
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                 "float64", "complex64", "complex128"):
        setattr(torch, name, DTYPES.setdefault(name, DType(name)))
    sys.modules["torch"], sys.modules["torch._C"] = torch, torch_c


def make(array, **kwargs):
    return Tensor(np.asarray(array), **kwargs)
