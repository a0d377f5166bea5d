"""Reading LWM's VQGAN parameter pickle (a pickled Flax parameter dict) without jax or flax, and
without trusting it: a restricted unpickler that knows only dicts and numpy arrays.

Unpickling calls whatever the file names, so only the names a tree of arrays pickles to are
allowed, and those that build arrays are replaced: an array comes only from the bytes the file
holds (numpy's `_reconstruct` followed by `__setstate__` with the data, or protocol 5's
`_frombuffer`), its size checked against them, never from a shape alone (numpy's own
reconstructors allocate the shape first, uninitialised, before any data arrives).
"""

from __future__ import annotations

import codecs
import math
import pickle
from pathlib import Path

import numpy as np

MAX_DEPTH = 16  # LWM's VQGAN tree is 5 dicts deep


class _Refused(pickle.UnpicklingError):
    pass


class _Array:
    """An array under construction: numpy's pickle makes an empty one, then BUILD hands it its
    state; this keeps the array rebuilt from that state's bytes."""

    array: np.ndarray | None = None

    def __setstate__(self, state) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _Refused("an array's state is not numpy's (version, shape, dtype, is_fortran, bytes)")
        _, shape, dtype, fortran, data = state
        self.array = _from_bytes(data, dtype, shape, "F" if fortran else "C")


def _from_bytes(data, dtype, shape, order: str) -> np.ndarray:
    """A numeric array of its own memory (native byte order) from exactly shape x itemsize bytes."""
    if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
        raise _Refused(f"an array's shape is {shape!r:.80}, expected a tuple of sizes")
    if not (isinstance(dtype, np.dtype) and dtype.kind == "f" and dtype.fields is None and dtype.subdtype is None):
        raise _Refused(f"an array's dtype is {dtype!r:.80}, expected a float dtype")
    if not isinstance(data, (bytes, bytearray)):
        raise _Refused(f"an array's data is a {type(data).__name__}, expected bytes")
    size = math.prod(shape) * dtype.itemsize
    if len(data) != size:
        raise _Refused(
            f"an array of shape {shape} and dtype {dtype} takes {size} bytes, but the pickle holds {len(data)}"
        )
    if order not in ("C", "F"):
        raise _Refused(f"an array's order is {order!r:.20}, expected 'C' or 'F'")
    return np.frombuffer(data, dtype).reshape(shape, order=order).astype(dtype.newbyteorder("="), order="C")


def _ndarray(*args):
    raise _Refused(
        "the pickle calls numpy.ndarray(...), which allocates memory it does not fill; "
        "numpy pickles an array as _reconstruct and its bytes"
    )


def _reconstruct(subtype, shape, code) -> _Array:
    # numpy always pickles (ndarray, (0,), b'b') here and sends the real shape with the bytes
    if subtype is not _ndarray or shape != (0,) or code not in (b"b", "b"):
        raise _Refused(f"numpy's _reconstruct called with ({shape!r:.40}, {code!r:.20}); numpy writes ((0,), b'b')")
    return _Array()


def _frombuffer(data, dtype, shape, order) -> _Array:  # protocol 5: the bytes come with the call
    array = _Array()
    array.array = _from_bytes(data, dtype, shape, order)
    return array


def _dtype(name, align=False, copy=True) -> np.dtype:
    if not isinstance(name, str) or len(name) > 8:  # numpy writes short codes: 'f4', 'i8'
        raise _Refused(f"a dtype named {name!r:.40}; a parameter's dtype is a short code such as 'f4'")
    return np.dtype(name, bool(align), bool(copy))


def _latin1(text, encoding="latin1") -> bytes:  # how protocol 2 writes bytes
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise _Refused(f"_codecs.encode with encoding {encoding!r:.20}; pickles write bytes as latin1 text")
    return codecs.encode(text, "latin1")


def _numpy_from_jax(fun, args, arr_state, aval_state=None) -> _Array:
    """A jax.Array pickles as numpy's own (reconstructor, args, state) plus jax-only aval state
    (weak_type, named_shape), which a numpy array has no use for."""
    if fun is not _reconstruct:
        raise _Refused("a jax array that is not rebuilt with numpy's _reconstruct")
    array = fun(*args)
    array.__setstate__(arr_state)
    return array


# What jax and flax objects pickle to, and what stands in for them here.
_JAX_FLAX = {
    ("flax.core.frozen_dict", "FrozenDict"): dict,  # FrozenDict.__reduce__ is (FrozenDict, (a dict,))
    ("jax._src.array", "_reconstruct_array"): _numpy_from_jax,  # jax.Array
    ("jax._src.device_array", "reconstruct_device_array"): _numpy_from_jax,  # DeviceArray (jax < 0.4)
}
# Everything else a pickle of nested dicts of numpy arrays refers to. Nothing beyond these is
# loaded: unpickling may otherwise call any importable function.
_ALLOWED = {
    **_JAX_FLAX,
    ("collections", "OrderedDict"): dict,
    ("_codecs", "encode"): _latin1,
    ("numpy", "ndarray"): _ndarray,
    ("numpy", "dtype"): _dtype,
}
# numpy's reconstructors live in numpy.core (numpy 1) or numpy._core (numpy 2).
for _package in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = _reconstruct
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = _frombuffer


class _ParamUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module.split(".")[0] in ("jax", "jaxlib", "flax", "ml_dtypes"):
            known = ", ".join(f"{m}.{n}" for m, n in _JAX_FLAX)
            raise _Refused(
                f"the pickle holds a {module}.{name}, which this reader (no jax or flax installed) cannot rebuild; "
                f"it maps only {known} (nested dicts of float arrays)"
            )
        raise _Refused(
            f"the pickle refers to {module}.{name}; a VQGAN parameter pickle holds only nested dicts of arrays"
        )


def _flatten(tree: dict, prefix: str, out: dict[str, np.ndarray], path: Path, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: parameter dicts nested deeper than {MAX_DEPTH} levels at {prefix!r:.200}")
    for key, value in tree.items():
        if not isinstance(key, str):
            raise ValueError(f"{path}: parameter dict key {prefix}{key!r:.80} is a {type(key).__name__}, expected str")
        if isinstance(value, dict):
            _flatten(value, f"{prefix}{key}/", out, path, depth + 1)
        elif isinstance(value, _Array) and value.array is not None and value.array.size:
            out[prefix + key] = value.array
        else:
            what = f"a {type(value).__name__}"
            if isinstance(value, _Array):
                what = "an array without its data" if value.array is None else f"an empty array {value.array.shape}"
            raise ValueError(f"{path}: parameter {prefix + key!r} is {what}, expected a float array")


def read_vqgan_pickle(path: str | Path) -> dict[str, np.ndarray]:
    """A pickled Flax parameter dict -> {'encoder/Conv_0/kernel': array, ...}, '/'-joined Flax paths,
    arrays as stored (numpy, float32 for LWM's VQGAN)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no VQGAN parameter pickle at {path}")
    try:
        with path.open("rb") as f:
            tree = _ParamUnpickler(f).load()
    except _Refused as e:
        raise ValueError(f"{path}: {e}") from e
    except Exception as e:  # truncated or not a pickle at all: EOFError, KeyError, ...
        raise ValueError(f"{path} is not a readable pickle ({type(e).__name__}: {e})") from e
    if not isinstance(tree, dict):
        raise ValueError(f"{path} holds a {type(tree).__name__}, expected a dict of parameter arrays")
    if list(tree) == ["params"]:  # a Flax variables dict around the parameters
        tree = tree["params"]
    out: dict[str, np.ndarray] = {}
    _flatten(tree, "", out, path)
    if not out:
        raise ValueError(f"{path} holds no parameter arrays")
    return out
