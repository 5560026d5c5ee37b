"""pfcps from Python: a pfcps worker inside the process (pfcps._C, the C worker's own join, sampling,
pull/push and CPU head) and, in pfcps.torch, arcface_torch's Partial FC interface over it.

PfcpsError (a RuntimeError) carries pfcps's message; .code is the negative errno."""
from ._C import PfcpsError, Worker

__all__ = ["PfcpsError", "Worker"]
__version__ = "0.1.0"
