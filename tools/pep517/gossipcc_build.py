"""gossipcc's PEP 517 build backend (pyproject.toml): `pip install --no-build-isolation .` and
`pip wheel --no-build-isolation .` from a clone.

Pure standard library. build_wheel runs Bazel (`bazel build //torch_backend:python_package`)
against the torch of the interpreter that runs pip (passed to the Bazel repository rule in
third_party/torch.bzl as --repo_env=GOSSIPCC_PYTHON), then writes the wheel itself: the
package's .py files, its generated _build_info.py, and the extension as
gossipcc/_C<EXT_SUFFIX>, tagged for this interpreter (e.g. cp311-cp311-linux_x86_64).

--no-build-isolation is required: the build needs the torch of the interpreter that will load
the extension, which an isolated build environment does not have (and nothing may be downloaded).

Settings (environment variables):
  GOSSIPCC_BAZEL         the Bazel binary (default: `bazel` on PATH)
  GOSSIPCC_BAZEL_ARGS    more arguments for `bazel build`, split on spaces (e.g. --jobs=2)
"""
import base64
import hashlib
import io
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

NAME = "gossipcc"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_TARGET = "//torch_backend:python_package"
BUILT_PACKAGE = os.path.join("torch_backend", "gossipcc")  # under bazel-bin
VERSION_FILE = os.path.join(ROOT, "torch_backend", "python", "gossipcc", "version.py")
SUMMARY = "Gossip and compressed collectives as a torch.distributed backend (\"gossipcc\") over Gloo and NCCL"


def version():
    """The one version, from torch_backend/python/gossipcc/version.py."""
    with open(VERSION_FILE) as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not match:
        raise RuntimeError(f"no __version__ = \"...\" line in {VERSION_FILE}")
    return match.group(1)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            f"gossipcc builds against the torch of the interpreter that runs pip ({sys.executable}), "
            f"which cannot import torch ({e}). Install torch for it first, and build with "
            "`pip install --no-build-isolation .` (an isolated build environment has no torch)") from e
    return torch


def wheel_tag():
    """python-abi-platform of this interpreter, as pip expects for an extension module."""
    if sys.implementation.name != "cpython":
        raise RuntimeError(f"gossipcc's extension is built for CPython only, not {sys.implementation.name}")
    version = "%d%d" % sys.version_info[:2]
    abi = "cp" + version
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        abi += "t"
    if hasattr(sys, "gettotalrefcount"):  # a debug build
        abi += "d"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"cp{version}-{abi}-{platform}"


def _dist_info_name():
    return f"{NAME}-{version()}.dist-info"


def _metadata():
    torch = _torch()
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version()}",
        f"Summary: {SUMMARY}",
        "Requires-Python: ==%d.%d.*" % sys.version_info[:2],
        # No Requires-Dist on torch: pip would then check torch's own requirements, which
        # Debian's python3-torch states as PyPI pins its Debian dependencies do not meet
        # (torch 2.6: sympy==1.13.1), and fail offline. The torch it needs is the one it was
        # built with, which is installed already; `import gossipcc` checks that it still is.
        "",
        f"Built with Bazel against torch {torch.__version__} of {sys.executable}. "
        "`python -m gossipcc.info` prints what it was built for and the settings it reads.",
        "",
    ])


def _wheel_file():
    return "\n".join([
        "Wheel-Version: 1.0",
        "Generator: gossipcc_build (tools/pep517)",
        "Root-Is-Purelib: false",
        f"Tag: {wheel_tag()}",
        "",
    ])


# ---- PEP 517 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name = _dist_info_name()
    os.makedirs(os.path.join(metadata_directory, name), exist_ok=True)
    for file, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file()), ("top_level.txt", NAME + "\n")):
        with open(os.path.join(metadata_directory, name, file), "w") as f:
            f.write(text)
    return name


def _log(message):
    print(f"gossipcc_build: {message}", file=sys.stderr, flush=True)


def _bazel_build():
    torch = _torch()
    bazel = os.environ.get("GOSSIPCC_BAZEL", "bazel")
    # --define=gossipcc_wheel=1: the extension links Gloo and Abseil statically, compiled from
    # Debian's source packages with hidden symbols (third_party/debian_sources.bzl; @gloo and
    # @absl select them), and exports only PyInit__C (torch_backend/python_module.lds).
    # --platform_suffix: its outputs (everything compiled against those headers) live in an
    # output directory of their own (k8-opt-wheel), so the wheel and the project's ordinary
    # builds do not evict each other's compiled files.
    command = [bazel, "build", "--define=gossipcc_wheel=1", "--platform_suffix=wheel"]
    # The default (unset) is /usr/bin/python3: leave it unset for that interpreter, so a pip
    # build there shares every cached action and repository with the project's own builds.
    if os.path.abspath(sys.executable) != "/usr/bin/python3":
        command.append(f"--repo_env=GOSSIPCC_PYTHON={sys.executable}")
    if not torch._C._GLIBCXX_USE_CXX11_ABI:
        # Everything that shares C++ types with torch must use its (old) ABI.
        command.append("--copt=-D_GLIBCXX_USE_CXX11_ABI=0")
        _log("this torch uses the pre-C++11 libstdc++ ABI: building with -D_GLIBCXX_USE_CXX11_ABI=0 "
             "(Gloo and Abseil are compiled from source with it too)")
    command += shlex.split(os.environ.get("GOSSIPCC_BAZEL_ARGS", "")) + [PACKAGE_TARGET]
    _log(f"building against torch {torch.__version__} of {sys.executable}: {' '.join(command)}")
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, stdout=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"bazel build failed (exit {result.returncode}): {' '.join(command)}")
    _log(f"bazel build took {time.monotonic() - start:.0f} s")
    built = os.path.join(ROOT, "bazel-bin", BUILT_PACKAGE)
    # bazel-bin is shared with every other build in this checkout: make sure what is there is
    # what this build made (the extension for this torch).
    info = {}
    with open(os.path.join(built, "_build_info.py")) as f:
        exec(f.read(), info)  # noqa: S102 - our own generated file
    if info["TORCH_VERSION"] != str(torch.__version__):
        raise RuntimeError(f"{built} holds a build for torch {info['TORCH_VERSION']}, not {torch.__version__}: "
                           "another build in this checkout replaced it; run pip again")
    return built


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _zip_info(arcname, mode):
    info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    built = _bazel_build()
    files = []  # (arcname, bytes, mode)
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for name in sorted(os.listdir(built)):
        path = os.path.join(built, name)
        if name == "_C.so":
            with open(path, "rb") as f:
                files.append((f"{NAME}/_C{ext_suffix}", f.read(), 0o755))
        elif name.endswith(".py"):
            with open(path, "rb") as f:
                files.append((f"{NAME}/{name}", f.read(), 0o644))
    if not any(arc.startswith(f"{NAME}/_C") for arc, _, _ in files):
        raise RuntimeError(f"no _C.so in {built}")
    dist_info = _dist_info_name()
    files += [
        (f"{dist_info}/METADATA", _metadata().encode(), 0o644),
        (f"{dist_info}/WHEEL", _wheel_file().encode(), 0o644),
        (f"{dist_info}/top_level.txt", (NAME + "\n").encode(), 0o644),
    ]
    record = [_record_line(arc, data) for arc, data, _ in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    wheel_name = f"{NAME}-{version()}-{wheel_tag()}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    target = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(target + ".tmp", "w") as whl:
        for arcname, data, mode in files:
            whl.writestr(_zip_info(arcname, mode), data)
    os.replace(target + ".tmp", target)
    _log(f"wrote {target} ({os.path.getsize(target) / 1e6:.1f} MB)")
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of this checkout (git ls-files) and PKG-INFO."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout
    paths = [p for p in listing.decode().split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]
    base = f"{NAME}-{version()}"
    os.makedirs(sdist_directory, exist_ok=True)
    target = os.path.join(sdist_directory, base + ".tar.gz")
    pkg_info = "\n".join(["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {version()}",
                          f"Summary: {SUMMARY}", ""]).encode()
    with tarfile.open(target, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            tar.add(os.path.join(ROOT, path), arcname=f"{base}/{path}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return os.path.basename(target)
