"""gossipcc's exceptions, raised by its extension (gossipcc._C) and re-exported by the package.

    CommError                 a failed communication (a RuntimeError); its subclasses:
      InvalidArgumentError    bad arguments or settings (also a ValueError)
      MismatchError           ranks called with different arguments (op, size, dtype, ...)
      CommTimeoutError        an operation or a rendezvous passed its timeout
      PeerError               a peer died, closed its connections or sent garbage
      AbortedError            the communicator is unusable after an earlier failure

CommTimeoutError is the extension's timeout class under a name that does not shadow Python's
builtin TimeoutError (it is a CommError, not a builtin TimeoutError). ``gossipcc.TimeoutError``
is a deprecated alias of it, kept for one release.
"""
from ._C import AbortedError, CommError, InvalidArgumentError, MismatchError, PeerError
from ._C import TimeoutError as CommTimeoutError

# The extension registers the class as _C.TimeoutError; name it where it is used, so that
# tracebacks and pickles (by module and qualified name) say gossipcc.CommTimeoutError.
CommTimeoutError.__name__ = CommTimeoutError.__qualname__ = "CommTimeoutError"
CommTimeoutError.__module__ = "gossipcc"

DEPRECATED_ALIASES = {"TimeoutError": ("CommTimeoutError", CommTimeoutError)}

__all__ = ["CommError", "InvalidArgumentError", "MismatchError", "CommTimeoutError", "PeerError", "AbortedError"]
