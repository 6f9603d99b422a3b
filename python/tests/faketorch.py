"""A stand-in for the parts of torch that ferry's fast path reads (python/src/torch.c), for
the fake-driver tests: ferry looks torch up in sys.modules once the program imported it, so a
worker that installs this module instead exercises the fast path without torch or a GPU.
Tensors are numpy arrays presented as CUDA memory (the fake driver's memory is host memory)
and count the DLPack exports they are asked for."""

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


class Tensor:
    def __init__(self, array, device=0, requires_grad=False, conj=False, contiguous=True):
        self._source = CudaLike(array, device)
        self.array = self._source.array
        self.device_index = device
        self.is_cuda = True
        self.requires_grad = requires_grad
        self.layout = strided
        self.dtype = DTYPES.setdefault(self.array.dtype.name, DType(self.array.dtype.name))
        self.shape = tuple(self.array.shape)
        self._conj = conj
        self._contiguous = contiguous  # what is_contiguous says (the data is C-ordered)
        self.dlpack_streams = []  # the stream argument of every __dlpack__ call

    def is_contiguous(self):
        return self._contiguous

    def is_conj(self):
        return self._conj

    def is_neg(self):
        return False

    def get_device(self):
        return self.device_index

    def data_ptr(self):
        return self.array.ctypes.data

    def __dlpack_device__(self):
        return self._source.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None):
        self.dlpack_streams.append(stream)
        return self._source.__dlpack__(stream=stream, max_version=max_version)


def _current_raw_stream(device):
    return CURRENT_STREAM.get(device, 0)


def install():
    """Makes this module the process's torch (and torch._C, torch.cuda)."""
    torch = types.ModuleType("torch")
    torch_c = types.ModuleType("torch._C")
    torch_c._cuda_getCurrentRawStream = _current_raw_stream
    cuda = types.SimpleNamespace(current_device=lambda: 0,
                                 device=lambda _: contextlib.nullcontext())
    torch.Tensor, torch.strided, torch._C, torch.cuda = Tensor, strided, torch_c, cuda
    sys.modules["torch"], sys.modules["torch._C"] = torch, torch_c


def make(array, **kwargs):
    return Tensor(np.asarray(array), **kwargs)
