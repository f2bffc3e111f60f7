"""Repository rules that bring Debian's system libraries (and /usr/local/cuda) in as Bazel targets.

Nothing here downloads: every repository points at files a Debian package (or the CUDA image)
installed. tools/setup.sh installs the packages.
"""

def _cuda_repository_impl(rctx):
    root = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    have = rctx.path(root + "/include/cuda_runtime.h").exists and rctx.path(root + "/include/nccl.h").exists
    if have:
        rctx.symlink(root + "/include", "include")
        rctx.symlink(root + "/lib64", "lib64")
        rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# CUDA runtime, cuBLAS and NCCL from {root}. Linked dynamically; the rpath lets
# binaries find them without LD_LIBRARY_PATH.
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
        "-lcudart",
    ],
)
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
""".format(root = root))

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
    native.new_local_repository(
        name = "gtest",
        path = "/usr",
        build_file = "@gossipcc//third_party:gtest.BUILD",
    )
    native.new_local_repository(
        name = "eigen",
        path = "/usr/include/eigen3",
        build_file = "@gossipcc//third_party:eigen.BUILD",
    )
    native.new_local_repository(
        name = "libtorch",
        path = "/usr",
        build_file = "@gossipcc//third_party:libtorch.BUILD",
    )
    cuda_repository(name = "cuda")
    python_repository(name = "python")
