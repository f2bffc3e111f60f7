"""`python -m gossipcc.info`: what this gossipcc is, what it was built against, and the settings
it would read from the environment now. Paste its output into bug reports.

`python -m gossipcc.info --json` prints the same as one JSON object (also `gossipcc.info.info()`).
"""
import json
import os
import sys

import torch

import gossipcc
from gossipcc import _build_info, _C

# Every environment variable gossipcc reads, with its default (docs/pytorch.md, "Environment
# variables"). The backend reads them when a process group is created.
ENVIRONMENT = [
    ("GOSSIPCC_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME, else GOSSIPCC_HOSTNAME, else the host name"),
    ("GLOO_SOCKET_IFNAME", "unset"),
    ("GOSSIPCC_HOSTNAME", "unset"),
    ("GOSSIPCC_ALLREDUCE", "exact"),
    ("GOSSIPCC_COLLECTIVE_LANES", "2"),
    ("GOSSIPCC_VERIFY_COLLECTIVES", "1"),
    ("GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE", "0"),
    ("GOSSIPCC_P2P_SEGMENT_BYTES", "262144"),
    ("GOSSIPCC_P2P_CONNECTION_PER_DIRECTION", "1"),
    ("GOSSIPCC_HEARTBEAT_INTERVAL_MS", "timeout / 10, in [50, 1000]"),
    ("GOSSIPCC_CUDA_DEVICE", "unset"),
    ("GOSSIPCC_POWERSGD_CPU_KERNELS", "unset"),
    ("USE_LIBUV", "torch's default (import gossipcc sets 0 on a torch built without libuv)"),
]


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
    environment = {name: os.environ.get(name) for name, _ in ENVIRONMENT}
    known = {name for name, _ in ENVIRONMENT}
    other = {k: v for k, v in sorted(os.environ.items()) if k.startswith("GOSSIPCC_") and k not in known}
    return {
        "gossipcc": gossipcc.__version__,
        "package": os.path.dirname(os.path.abspath(gossipcc.__file__)),
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
        "environment": environment,
        "other_gossipcc_environment": other,
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
        lines.append("CUDA: not compiled in (no CUDA toolkit with NCCL at build time): CPU tensors only;"
                     " NCCL: not compiled in")
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
    width = max(len(name) for name, _ in ENVIRONMENT)
    for name, default in ENVIRONMENT:
        value = r["environment"][name]
        lines.append(f"  {name:<{width}}  " + (f"= {value}" if value is not None else
                                                   "unset" if default == "unset" else f"unset (default: {default})"))
    for name, value in r["other_gossipcc_environment"].items():
        lines.append(f"  {name:<{width}}  = {value}   (not a setting gossipcc reads)")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    report = info()
    if "--json" in argv:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))


if __name__ == "__main__":
    main()
