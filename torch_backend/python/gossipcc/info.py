"""`/usr/bin/python3 -m gossipcc.info`: what this gossipcc is, what it was built against, whether CUDA
tensors will work, and the settings it would read from the environment now, each checked as
creating a process group checks it. Paste its output into bug reports.

`/usr/bin/python3 -m gossipcc.info --json` prints the same as one JSON object (also `gossipcc.info.info()`).
The exit status is 1 when a variable is set to a value that creating a process group would
refuse, or a GOSSIPCC_* variable is set that gossipcc does not read (a misspelt name), else 0.
"""
import argparse
import difflib
import json
import os
import sys

import torch

from . import _build_info, _C
from .version import __version__

# Read by torch's TCPStore (and by gossipcc's fixes of its callers, _torch_patches.py), not by
# the backend: (name, default, must every rank agree).
_PYTHON_ENVIRONMENT = [
    ("USE_LIBUV", "set to 0 by `import gossipcc` on a torch built without libuv", False),
]

# Every environment variable gossipcc reads, as dicts {name, default, agree}, in the order of
# docs/pytorch.md's "Environment variables" table (a test compares the two). The backend's come
# from the extension, which validates them (_C.check_environment).
ENVIRONMENT = [{"name": v["name"], "default": v["default"], "agree": v["agree"]}
               for v in _C.environment_variables()] + \
              [{"name": n, "default": d, "agree": a} for n, d, a in _PYTHON_ENVIRONMENT]

# GOSSIPCC_* variables that gossipcc's build, test and benchmark tools read (tools/, tests/,
# third_party/), not the installed package: listed as such, never flagged as unknown.
TOOL_VARIABLES = {
    "GOSSIPCC_BAZEL", "GOSSIPCC_BAZEL_ARGS", "GOSSIPCC_CUDA_LIBS", "GOSSIPCC_DEBIAN_MIRROR",
    "GOSSIPCC_FT_TEST_FAULT_TOLERANT", "GOSSIPCC_GPU_TEST_TIMEOUT", "GOSSIPCC_NETNS_IFACE", "GOSSIPCC_NETWORK",
    "GOSSIPCC_PYTHON", "GOSSIPCC_SLURM_CPUS", "GOSSIPCC_SLURM_DIR", "GOSSIPCC_SLURM_PORT",
    "GOSSIPCC_SLURM_START_TIMEOUT_S", "GOSSIPCC_SRC_CACHE", "GOSSIPCC_SUITE_HANG_DUMP_S", "GOSSIPCC_TEST_INIT_FILE",
    "GOSSIPCC_TEST_JOBS", "GOSSIPCC_TOOLS", "GOSSIPCC_TORCH_CUDA", "GOSSIPCC_TRIXIE_ROOT", "GOSSIPCC_WHEEL_PYTHON",
}


def check_environment():
    """Every variable of ENVIRONMENT that is set, and every other GOSSIPCC_* variable, as dicts
    {name, value, status, message}: status "ok", "invalid" (message: why, as creating a process
    group would say it), "unused" (message: which variable takes precedence), "unknown" (a
    GOSSIPCC_* name gossipcc does not read; message: the closest it does) or "tool" (read by
    gossipcc's tools, not by the package). The backend's variables are checked by the extension,
    with the code that checks them when a process group is created."""
    environ = os.environ
    found = []
    for f in _C.check_environment():
        status = "invalid" if f["error"] else "unused" if f["note"] else "ok"
        found.append({"name": f["name"], "value": f["value"], "status": status, "message": f["error"] or f["note"]})
    known = {v["name"] for v in ENVIRONMENT}
    value = environ.get("USE_LIBUV")
    if value:
        ok = value in ("0", "1")
        found.append({"name": "USE_LIBUV", "value": value, "status": "ok" if ok else "invalid",
                      "message": "" if ok else f"USE_LIBUV must be 0 or 1, got '{value}' (torch and gossipcc "
                                               "take any value but 1 as 0)"})
    for name in sorted(environ):
        if not name.startswith("GOSSIPCC_") or name in known:
            continue
        if name in TOOL_VARIABLES:
            found.append({"name": name, "value": environ[name], "status": "tool",
                          "message": "read by gossipcc's build and test tools, not by the package"})
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        found.append({"name": name, "value": environ[name], "status": "unknown",
                      "message": f"gossipcc reads no variable {name}"
                                 + (f"; did you mean {close[0]}?" if close else "")
                                 + " (docs/pytorch.md, \"Environment variables\", lists them)"})
    return found


def cuda_tensors():
    """(whether CUDA tensors will work on a gossipcc process group here, why)."""
    if not _build_info.WITH_CUDA:
        return False, ("this gossipcc was built without CUDA (no CUDA toolkit with NCCL at build time): "
                       "CPU tensors only")
    if torch.version.cuda is None:
        return False, (f"this torch ({torch.__version__}) is built without CUDA, so it makes no CUDA tensors; "
                       "install a CUDA build of torch")
    count = torch.cuda.device_count()
    if count == 0:
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        return False, ("no CUDA device is visible to this process (torch.cuda.device_count() is 0"
                       + (f"; CUDA_VISIBLE_DEVICES='{mask}'" if mask is not None else
                          ": no GPU, or no driver")
                       + ")")
    return True, (f"{count} CUDA device(s) visible (cuda:0" + (f" to cuda:{count - 1}" if count > 1 else "")
                  + f"), moved over NCCL {_build_info.NCCL_VERSION}")


def _loaded_libraries(*needles):
    """Shared objects mapped into this process whose file name contains one of needles."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if any(n in name for n in needles):
                    found.add(path)
    except OSError:
        pass
    return sorted(found)


def info():
    """The report as a dict."""
    environment = {v["name"]: os.environ.get(v["name"]) for v in ENVIRONMENT}
    known = set(environment)
    other = {k: v for k, v in sorted(os.environ.items()) if k.startswith("GOSSIPCC_") and k not in known}
    cuda_ok, cuda_why = cuda_tensors()
    return {
        "gossipcc": __version__,
        "package": os.path.dirname(os.path.abspath(__file__)),
        "extension": os.path.abspath(_C.__file__),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "python_executable": sys.executable,
        "torch": str(torch.__version__),
        "torch_path": os.path.dirname(os.path.abspath(torch.__file__)),
        "built_for_torch": _build_info.TORCH_VERSION,
        "built_for_python": _build_info.PYTHON_VERSION,
        "torch_cxx11_abi": _build_info.TORCH_CXX11_ABI,
        "cuda_compiled_in": _build_info.WITH_CUDA,
        "cuda_version": _build_info.CUDA_VERSION,
        "nccl_version": _build_info.NCCL_VERSION,
        "torch_cuda": torch.version.cuda,
        "transport": {
            "cpu": "gloo (TCP)",
            "cuda": "nccl" if _build_info.WITH_CUDA else None,
        },
        # Debian source packages compiled into the extension (the wheel: Gloo and Abseil with
        # hidden symbols), by package name; empty when it links Debian's shared ones.
        "static_libraries": dict(getattr(_build_info, "STATIC_LIBRARIES", {})),
        # Shared Gloo/Abseil/NCCL/CUDA runtime mapped into this process: the extension's, or
        # torch's own (Debian's libtorch_cpu.so links libgloo.so.0).
        "shared_libraries": _loaded_libraries("libgloo", "libabsl", "libnccl", "libcudart"),
        "cuda_tensors": cuda_ok,
        "cuda_tensors_why": cuda_why,
        "environment": environment,
        "other_gossipcc_environment": other,
        # Every set variable checked: see check_environment.
        "environment_check": check_environment(),
    }


def format_report(r):
    lines = [
        f"gossipcc {r['gossipcc']}",
        f"  package:      {r['package']}",
        f"  extension:    {r['extension']}",
        f"python {r['python']} ({r['python_executable']}); built for Python {r['built_for_python']}",
        f"torch {r['torch']} ({r['torch_path']}); built against torch {r['built_for_torch']}"
        f" (C++11 ABI {int(r['torch_cxx11_abi'])})",
    ]
    if r["cuda_compiled_in"]:
        lines.append(f"CUDA: compiled in, CUDA {r['cuda_version']}, NCCL {r['nccl_version']}"
                     f" (torch's CUDA: {r['torch_cuda']})")
    else:
        lines.append("CUDA: not compiled in (no CUDA toolkit with NCCL at build time); NCCL: not compiled in")
    lines.append(("CUDA tensors: yes, " if r["cuda_tensors"] else "CUDA tensors: no, ") + r["cuda_tensors_why"])
    lines.append(f"transport: CPU tensors over {r['transport']['cpu']}"
                 + (f", CUDA tensors over {r['transport']['cuda']}" if r["transport"]["cuda"] else ""))
    for family in ("libgloo", "libabsl", "libnccl", "libcudart"):
        paths = [p for p in r["shared_libraries"] if os.path.basename(p).startswith(family)]
        what = family[3:]
        package = {"gloo": "gloo", "absl": "abseil"}.get(what)
        if package in r.get("static_libraries", {}):
            line = (f"{what}: linked statically, hidden (Debian source package {package} "
                    f"{r['static_libraries'][package]})")
            if paths:  # not gossipcc's: e.g. Debian's libtorch_cpu.so links libgloo.so.0
                line += f"; the process also has {', '.join(paths)} (not used by gossipcc)"
            lines.append(line)
        elif not paths:
            lines.append(f"{what}: no shared library loaded")
        elif len(paths) == 1:
            lines.append(f"{what}: shared, {paths[0]}")
        else:
            lines.append(f"{what}: shared, {len(paths)} libraries in {os.path.dirname(paths[0])}")
    lines.append("environment (read when a process group is created):")
    width = max(len(v["name"]) for v in ENVIRONMENT)
    checked = {f["name"]: f for f in r["environment_check"]}
    for v in ENVIRONMENT:
        name, default = v["name"], v["default"]
        value = r["environment"][name]
        if value is None or value == "":
            lines.append(f"  {name:<{width}}  " + ("unset" if default == "unset" else f"unset (default: {default})"))
            continue
        line = f"  {name:<{width}}  = {value}"
        f = checked.get(name)
        if f is not None and f["status"] == "invalid":
            line += f"   INVALID: {f['message']}"
        elif f is not None and f["status"] == "unused":
            line += f"   ({f['message']})"
        lines.append(line)
    for f in r["environment_check"]:
        if f["status"] == "unknown":
            lines.append(f"  {f['name']:<{width}}  = {f['value']}   UNKNOWN: {f['message']}")
        elif f["status"] == "tool":
            lines.append(f"  {f['name']:<{width}}  = {f['value']}   ({f['message']})")
    bad = [f for f in r["environment_check"] if f["status"] in ("invalid", "unknown")]
    if bad:
        lines.append(f"{len(bad)} setting(s) to fix: " + ", ".join(f["name"] for f in bad))
    else:
        lines.append("every setting is valid")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m gossipcc.info",
        description="What this gossipcc is, what it was built against, whether CUDA tensors will work, and "
                    "the gossipcc settings in the environment, each checked as creating a process group "
                    "checks it. Paste the output into bug reports.",
        epilog="Exit status: 1 when a setting is invalid or a GOSSIPCC_* variable is unknown (a misspelt "
               "name), else 0. The variables: docs/pytorch.md, \"Environment variables\".")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    report = info()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 1 if any(f["status"] in ("invalid", "unknown") for f in report["environment_check"]) else 0


if __name__ == "__main__":
    sys.exit(main())
