"""pfcps from Python: a pfcps worker inside the process (pfcps._C, the C worker's own join, sampling,
pull/push and CPU head) and, in pfcps.torch, arcface_torch's Partial FC interface over it.

PfcpsError (a RuntimeError) carries pfcps's message; .code is the negative errno."""
import signal
import threading

from ._C import PfcpsError, Worker


def _restore_stop_signals():
    """Puts Python's own SIGINT / SIGTERM handling back. libfabric's psm provider pulls in libinfinipath, whose
    constructor (run when pfcps._C is loaded) installs handlers that exit(1) without a word: Ctrl-C would end the
    script without KeyboardInterrupt, finally blocks or the module's orderly leave (the pfcps daemons block these
    signals before any constructor instead; a shared object cannot). Main thread only, as signal.signal."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(sig)
        if h is not None:
            signal.signal(sig, h)


_restore_stop_signals()

__all__ = ["PfcpsError", "Worker"]
__version__ = "0.1.0"
