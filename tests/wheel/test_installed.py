"""Checks of gossipcc installed from its wheel (tools/wheel_test.sh runs this with the venv's
interpreter, from a directory outside the source tree, after `pip install`)."""
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import torch

import gossipcc


def _inside(path, directory):
    return os.path.realpath(path).startswith(os.path.realpath(directory) + os.sep)


def test_imported_from_the_environment_not_the_source_tree():
    assert _inside(gossipcc.__file__, sys.prefix), (gossipcc.__file__, sys.prefix)
    assert _inside(gossipcc._C.__file__, sys.prefix), gossipcc._C.__file__
    assert not any("bazel-" in p for p in sys.path), sys.path


def test_one_version_for_package_and_wheel():
    assert gossipcc.__version__ == importlib.metadata.version("gossipcc")


def test_info_reports_the_build():
    out = subprocess.run([sys.executable, "-m", "gossipcc.info", "--json"], check=True,
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, GOSSIPCC_ALLREDUCE="exact")).stdout
    report = json.loads(out)
    assert report["gossipcc"] == gossipcc.__version__
    assert report["built_for_torch"] == report["torch"] == str(torch.__version__)
    assert report["built_for_python"] == "%d.%d" % sys.version_info[:2]
    assert report["environment"]["GOSSIPCC_ALLREDUCE"] == "exact"
    assert report["transport"]["cpu"] == "gloo (TCP)"
    # The wheel links Gloo and Abseil from Debian's source packages (third_party/debian_sources.bzl).
    assert sorted(report["static_libraries"]) == ["abseil", "gloo"], report["static_libraries"]
    text = subprocess.run([sys.executable, "-m", "gossipcc.info"], check=True, stdout=subprocess.PIPE,
                          text=True).stdout
    assert f"gossipcc {gossipcc.__version__}" in text and "GLOO_SOCKET_IFNAME" in text
    assert "gloo: linked statically, hidden (Debian source package gloo " in text, text
    assert "absl: linked statically, hidden (Debian source package abseil " in text, text


def _import_copy_with(tmp_path, name, value):
    """Imports a copy of the installed package whose _build_info.py says NAME = value."""
    copy = tmp_path / "gossipcc"
    shutil.copytree(os.path.dirname(gossipcc.__file__), copy)
    info = copy / "_build_info.py"
    lines = [f"{name} = {value!r}" if line.startswith(f"{name} = ") else line
             for line in info.read_text().splitlines()]
    info.write_text("\n".join(lines) + "\n")
    probe = ("import sys\n"
             "try:\n"
             "    import gossipcc\n"
             "except ImportError as e:\n"
             "    print('ImportError:', e)\n"
             "    print('_C loaded:', 'gossipcc._C' in sys.modules)\n"
             "    print('from:', sys.modules['gossipcc._build_info'].__file__)\n")
    return subprocess.run([sys.executable, "-c", probe], check=True, stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path))).stdout


def test_another_torch_is_refused_naming_both_versions(tmp_path):
    out = _import_copy_with(tmp_path, "TORCH_VERSION", "0.0.1+another")
    assert "ImportError: gossipcc" in out, out
    assert "built against torch 0.0.1+another" in out, out
    assert f"imports torch {torch.__version__}" in out, out
    assert "_C loaded: False" in out, out  # refused before the extension is loaded
    assert str(tmp_path) in out, out  # it was the copy that refused


def test_another_python_is_refused(tmp_path):
    out = _import_copy_with(tmp_path, "PYTHON_VERSION", "3.0")
    assert "built for Python 3.0" in out and "_C loaded: False" in out, out


def _extension():
    return gossipcc._C.__file__


def test_extension_exports_only_its_entry_point():
    # No gloo:: or absl:: (or gossipcc::) symbol is visible to the rest of the process: the
    # extension's copies of inline and template code cannot interpose on torch's, or the reverse.
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", _extension()], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert not [n for n in names if n.startswith(("gloo::", "absl::"))], out
    assert [n for n in names if n != "PyInit__C" and not n.startswith(("_init", "_fini", "_edata", "_end",
                                                                       "__bss_start"))] == [], out


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, stdout=subprocess.PIPE, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_extension_needs_no_shared_gloo_or_absl():
    # The extension's own dependencies (readelf), not ldd's closure: Debian's libtorch_cpu.so
    # itself needs libgloo.so.0. The wheel links Gloo and Abseil statically, compiled from
    # Debian's source packages (third_party/debian_sources.bzl); tools/wheel_test.sh also runs
    # tools/extension_isolation_check.sh (readelf, ldd, nm -D) on the installed extension.
    needed = _needed(_extension())
    assert not [n for n in needed if n.startswith(("libgloo", "libabsl"))], needed
