"""Repository rules that bring Debian's system libraries (and /usr/local/cuda) in as Bazel targets.

Nothing here downloads: every repository points at files a Debian package (or the CUDA image)
installed. tools/setup.sh installs the packages.
"""

load("//third_party:debian_sources.bzl", "debian_source_repository")
load("//third_party:torch.bzl", "torch_repository")

def _cuda_repository_impl(rctx):
    root = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    have = rctx.path(root + "/include/cuda_runtime.h").exists and rctx.path(root + "/include/nccl.h").exists
    _cuda_build_info(rctx, root, have)
    if have:
        rctx.symlink(root + "/include", "include")
        rctx.symlink(root + "/lib64", "lib64")
        rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# CUDA runtime, cuBLAS and NCCL from {root}. Linked dynamically; the rpath lets
# binaries find them without LD_LIBRARY_PATH.
# --define=gossipcc_cudart=static (tools/gpu_bundle.sh): the CUDA runtime linked statically, so
# that a bundle needs only the GPU machine's NCCL and cuBLAS.
config_setting(
    name = "static_cudart",
    define_values = {{"gossipcc_cudart": "static"}},
)

cc_library(
    name = "cuda",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    defines = ["GOSSIPCC_WITH_CUDA=1"],
    linkopts = [
        "-L{root}/lib64",
        "-Wl,-rpath,{root}/lib64",
        "-lnccl",
        "-lcublas",
    ] + select({{
        ":static_cudart": ["-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
        "//conditions:default": ["-lcudart"],
    }}),
)

exports_files(["build_info.py"])
""".format(root = root))
    else:
        rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit at {root}: CUDA code paths compile out and report
# "built without CUDA" at run time.
cc_library(
    name = "cuda",
    defines = ["GOSSIPCC_WITH_CUDA=0"],
)

exports_files(["build_info.py"])
""".format(root = root))

def _header_define(rctx, path, name):
    # The value of `#define NAME value` in a header, or None.
    if not rctx.path(path).exists:
        return None
    for line in rctx.read(path).split("\n"):
        words = [w for w in line.replace("\t", " ").split(" ") if w]
        if len(words) >= 3 and words[0] == "#define" and words[1] == name:
            return words[2]
    return None

def _cuda_build_info(rctx, root, have):
    # What the extension's CUDA path was compiled with, for gossipcc/_build_info.py.
    cuda, nccl = None, None
    if have:
        runtime = _header_define(rctx, root + "/include/cuda_runtime_api.h", "CUDART_VERSION")
        if runtime and runtime.isdigit():
            cuda = "%d.%d" % (int(runtime) // 1000, int(runtime) % 1000 // 10)
        parts = [_header_define(rctx, root + "/include/nccl.h", "NCCL_" + p) for p in ["MAJOR", "MINOR", "PATCH"]]
        if None not in parts:
            nccl = ".".join(parts)
    rctx.file("build_info.py", """# CUDA/NCCL compiled into gossipcc's extension (third_party/system_libs.bzl).
WITH_CUDA = {have}
CUDA_VERSION = {cuda}
NCCL_VERSION = {nccl}
""".format(have = "True" if have else "False", cuda = repr(cuda) if cuda else "None", nccl = repr(nccl) if nccl else "None"))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_HOME"],
    local = True,
)

def _python_repository_impl(rctx):
    # The interpreter that has torch: Debian's /usr/bin/python3 (3.11 on bookworm, 3.13 in the
    # trixie root). Its C headers, for the pybind11 extension module.
    python = rctx.os.environ.get("GOSSIPCC_PYTHON", "/usr/bin/python3")
    result = rctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
    include = result.stdout.strip()
    if result.return_code != 0 or not include or not rctx.path(include + "/Python.h").exists:
        fail("gossipcc: no Python headers for {} (install python3-dev): {}".format(python, result.stderr))
    rctx.symlink(include, "include")
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# Python headers of {python} and Debian's pybind11 (/usr/include/pybind11). Extension
# modules resolve libpython's symbols from the interpreter that loads them.
cc_library(
    name = "python_headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)
""".format(python = python))

python_repository = repository_rule(
    implementation = _python_repository_impl,
    environ = ["GOSSIPCC_PYTHON"],
    local = True,
)

def gossipcc_system_libraries():
    native.new_local_repository(
        name = "gloo",
        path = "/usr",
        build_file = "@gossipcc//third_party:gloo.BUILD",
    )
    native.new_local_repository(
        name = "absl",
        path = "/usr",
        build_file = "@gossipcc//third_party:absl.BUILD",
    )
    # Static copies for the wheel's extension (--define=gossipcc_wheel=1): @gloo and @absl
    # select them there. From the Debian source packages tools/setup.sh fetches.
    debian_source_repository(
        name = "gloo_source",
        package = "gloo",
        target = "gloo",
        build_file = "@gossipcc//third_party:gloo_source.BUILD",
    )
    debian_source_repository(
        name = "absl_source",
        package = "abseil",
        target = "absl",
        build_file = "@gossipcc//third_party:absl_source.BUILD",
    )
    native.new_local_repository(
        name = "gtest",
        path = "/usr",
        build_file = "@gossipcc//third_party:gtest.BUILD",
    )
    native.new_local_repository(
        name = "netfilter_queue",
        path = "/usr",
        build_file = "@gossipcc//third_party:netfilter_queue.BUILD",
    )
    native.new_local_repository(
        name = "eigen",
        path = "/usr/include/eigen3",
        build_file = "@gossipcc//third_party:eigen.BUILD",
    )
    torch_repository(
        name = "libtorch",
        build_file = "@gossipcc//third_party:libtorch.BUILD",
    )
    cuda_repository(name = "cuda")
    python_repository(name = "python")
