"""gossipcc's version: the one place it is written. The package (`gossipcc.__version__`) and
the wheel's metadata (tools/pep517/gossipcc_build.py reads this file) both take it from here."""
__version__ = "0.1.0"
