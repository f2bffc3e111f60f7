"""torch_repository: LibTorch as a Bazel target, taken from the torch of one Python interpreter.

The interpreter is $GOSSIPCC_PYTHON (pass it with --repo_env=GOSSIPCC_PYTHON=...), by default
Debian's /usr/bin/python3 (python3-torch: torch 1.13 on bookworm, 2.6 in the trixie root). The
rule runs it once to ask where its torch keeps its headers and libraries, which C++ ABI it was
built with, and its version; the same tree so builds against any torch without edits. The
pip build backend (tools/pep517/gossipcc_build.py) sets the variable to the interpreter that
runs pip.

Generated files: BUILD.bazel (targets :libtorch and :torch_python, from libtorch.BUILD) and
build_info.py (what the build was made against; copied into the package as
gossipcc/_build_info.py, which `import gossipcc` checks against the running torch).
"""

# Printed as JSON on the last line of stdout; torch's own import noise goes before it.
_QUERY = """
import json, os, sys
import torch
root = os.path.dirname(os.path.abspath(torch.__file__))
print(json.dumps({
    "version": str(torch.__version__),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    "cuda": torch.version.cuda,
    "include": os.path.join(root, "include"),
    "lib": os.path.join(root, "lib"),
    "python": "%d.%d" % sys.version_info[:2],
    "distributed": bool(torch.distributed.is_available()),
}))
"""

# Directories the compiler and linker search anyway: headers and libraries found there need no
# -isystem/-L (and /usr/include must not get one: it would break libstdc++'s #include_next).
_DEFAULT_INCLUDE_DIRS = ["/usr/include", "/usr/local/include"]
_DEFAULT_LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib"]

def _dirname(path):
    return path.rpartition("/")[0]

def _realpath(rctx, path):
    result = rctx.execute(["realpath", "-e", path])
    if result.return_code != 0:
        return None
    return result.stdout.strip()

def _torch_repository_impl(rctx):
    python = rctx.os.environ.get("GOSSIPCC_PYTHON", "/usr/bin/python3")
    result = rctx.execute([python, "-c", _QUERY], environment = {"PYTHONWARNINGS": "ignore"})
    lines = result.stdout.strip().split("\n")
    if result.return_code != 0 or not lines[-1].startswith("{"):
        fail("gossipcc: {} cannot import torch (install torch for it, or point GOSSIPCC_PYTHON at an interpreter that has it): {}".format(python, result.stderr))
    info = json.decode(lines[-1])
    if not info["distributed"]:
        fail("gossipcc: the torch of {} ({}) is built without torch.distributed".format(python, info["version"]))

    # Headers: one symlink per entry of torch's include directory (torch, ATen, c10, ...), so
    # the labels are include/torch/... whatever the layout (Debian's entries are symlinks into
    # /usr/include; a pip wheel's are real directories in site-packages).
    include = info["include"]
    entries = rctx.execute(["ls", "-1", include])
    if entries.return_code != 0 or not entries.stdout.strip():
        fail("gossipcc: no C++ headers at {} (torch {} of {}; Debian: install libtorch-dev)".format(include, info["version"], python))
    on_default_path = True
    for name in entries.stdout.strip().split("\n"):
        target = _realpath(rctx, include + "/" + name)
        if target == None:
            continue
        rctx.symlink(target, "include/" + name)
        if _dirname(target) not in _DEFAULT_INCLUDE_DIRS:
            on_default_path = False
    includes = ["include/torch/csrc/api/include"]
    if not on_default_path:
        includes = ["include"] + includes

    # Libraries: by name, with -L and an rpath to torch's lib directory unless the linker finds
    # them there anyway (Debian: torch/lib/libtorch.so -> /usr/lib/x86_64-linux-gnu/...).
    libtorch = _realpath(rctx, info["lib"] + "/libtorch.so")
    if libtorch == None:
        fail("gossipcc: no libtorch.so in {} (torch {} of {})".format(info["lib"], info["version"], python))
    search = []
    if _dirname(libtorch) not in _DEFAULT_LIB_DIRS:
        search = ["-L" + info["lib"], "-Wl,-rpath," + info["lib"]]
    defines = []
    if not info["cxx11_abi"]:
        # Only torch_backend/ sees this; the rest of the build must get it too
        # (--copt=-D_GLIBCXX_USE_CXX11_ABI=0, which the pip build backend adds).
        defines = ["_GLIBCXX_USE_CXX11_ABI=0"]

    cuda_libs = []
    if info["cuda"] and rctx.path(info["lib"] + "/libc10_cuda.so").exists:
        # A CUDA torch: the backend follows torch's current CUDA stream (c10/cuda/CUDAStream.h,
        # torch_backend/tensor_buffer.cc), which lives in libc10_cuda.
        defines.append("GOSSIPCC_TORCH_CUDA=1")
        cuda_libs = ["-lc10_cuda"]
        if not search:
            search = []

    rctx.template("BUILD.bazel", rctx.attr.build_file, {
        "%{cuda_libs}": repr(cuda_libs),
        "%{includes}": repr(includes),
        "%{defines}": repr(defines),
        "%{search}": repr(search),
        "%{version}": info["version"],
    })
    rctx.file("build_info.py", """# What gossipcc's extension was built against (third_party/torch.bzl).
TORCH_VERSION = {version}
TORCH_CXX11_ABI = {abi}
TORCH_CUDA = {cuda}
PYTHON_VERSION = {python}
""".format(
        version = repr(info["version"]),
        abi = "True" if info["cxx11_abi"] else "False",
        cuda = repr(info["cuda"]) if info["cuda"] else "None",
        python = repr(info["python"]),
    ))

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    attrs = {"build_file": attr.label(allow_single_file = True)},
    environ = ["GOSSIPCC_PYTHON"],
    local = True,
)
