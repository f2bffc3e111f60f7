"""pytest_test: one Python test file (multi-process pytest) as a Bazel test."""

def pytest_test(name, src, pytest_args = [], data = [], size = "medium", tags = []):
    """Runs pytest on `src` (a file of this package) with the gossipcc package built.

    Tagged "python": tools/test.sh leaves these out of the sanitizer stages (the extension
    and torch are not instrumented).

    Args:
      name: target name.
      src: the test file, e.g. "test_ddp.py".
      pytest_args: more pytest arguments, e.g. ["-k", "'not slow'"] (Bazel splits args on
        spaces unless quoted).
      data: further files the test reads or imports.
      size: Bazel test size.
      tags: further tags.
    """
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//tests:run_pytest.sh"],
        args = ["%s/%s" % (native.package_name(), src)] + pytest_args,
        data = [src, "//torch_backend:python_package"] + data,
        tags = ["python"] + tags,
    )
