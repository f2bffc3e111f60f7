"""The check `import gossipcc` makes before it loads its extension: the running torch and Python
must be the ones the extension was built against (recorded in _build_info.py at build time).
torch's C++ API has no stable ABI across versions, so another torch would fail later, in
obscure ways (missing symbols, or memory corrupted by a changed class layout)."""
import os
import sys

from . import _build_info
from .version import __version__

REBUILD_HINT = ("rebuild gossipcc with this interpreter: `{python} -m pip install --no-build-isolation "
                "--force-reinstall <gossipcc source directory>` (docs/pytorch.md)")


def check_torch(torch):
    """Raises ImportError naming both versions when the running torch or Python is not the one
    gossipcc's extension was built for."""
    built, running = _build_info.TORCH_VERSION, str(torch.__version__)
    hint = REBUILD_HINT.format(python=sys.executable)
    if running != built:
        raise ImportError(
            f"gossipcc {__version__} was built against torch {built}, but this interpreter imports "
            f"torch {running} (from {os.path.dirname(torch.__file__)}); its extension works only "
            f"with the torch it was built against: {hint}")
    python = "%d.%d" % sys.version_info[:2]
    if python != _build_info.PYTHON_VERSION:
        raise ImportError(
            f"gossipcc {__version__} was built for Python {_build_info.PYTHON_VERSION}, but this is "
            f"Python {python} ({sys.executable}): {hint}")
