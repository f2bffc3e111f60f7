"""debian_source_repository: a library compiled from a Debian source package that tools/setup.sh
fetched, for the wheel's self-contained extension (--define=gossipcc_wheel=1, tools/pep517).

tools/setup.sh downloads the upstream and Debian tarballs of trixie's `abseil` and `gloo` source
packages into $GOSSIPCC_SRC_CACHE (default /var/cache/gossipcc/src) and lists them in its
SOURCES manifest (`package version upstream-tarball debian-tarball`). This rule unpacks the
package named by `package`, applies the Debian patches (debian/patches/series, as dpkg-source
does), removes the tree's own Bazel files (Abseil ships BUILD.bazel files for a newer Bazel; they
would cut the globs of `build_file` into packages), makes what the upstream CMake build would
generate, and writes `build_file` as the repository's BUILD.bazel. Nothing is downloaded here.

Without the manifest or the tarballs, the repository still loads (the project's ordinary build
never selects it), and building its target fails naming tools/setup.sh.
"""

_UNPACK = """
set -eu
orig="$1"; debian="$2"
rm -rf .unpack && mkdir .unpack
tar -xf "$orig" -C .unpack
# An upstream tarball with one top-level directory (abseil-20240722.0/) or none (gloo).
if [ "$(ls -A .unpack | wc -l)" = 1 ] && [ -d ".unpack/$(ls -A .unpack)" ]; then
  top=".unpack/$(ls -A .unpack)"
else
  top=.unpack
fi
for entry in "$top"/* "$top"/.[!.]*; do [ -e "$entry" ] && mv "$entry" .; done
rm -rf .unpack
tar -xf "$debian"
if [ -f debian/patches/series ]; then
  sed -e 's/#.*//' debian/patches/series | while read -r patch options; do
    [ -n "$patch" ] || continue
    patch -s -p1 --no-backup-if-mismatch ${options:-} <"debian/patches/$patch"
  done
fi
find . \\( -name BUILD -o -name BUILD.bazel -o -name WORKSPACE -o -name WORKSPACE.bazel -o -name MODULE.bazel \\) -type f -delete
"""

def _manifest_entry(rctx, cache, package):
    manifest = rctx.path(cache + "/SOURCES")
    if not manifest.exists:
        return None
    for line in rctx.read(manifest).split("\n"):
        words = line.split(" ")
        if len(words) == 4 and words[0] == package:
            return struct(version = words[1], orig = cache + "/" + words[2], debian = cache + "/" + words[3])
    return None

def _missing(rctx, cache, why):
    # Loads, so that the ordinary build (which never selects this repository) is unaffected;
    # building the library says what to do.
    message = "gossipcc: the wheel build compiles {target} from the Debian source package {package}, but {why}: run tools/setup.sh (it fetches it into {cache})".format(
        target = rctx.attr.target,
        package = rctx.attr.package,
        why = why,
        cache = cache,
    )
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

genrule(
    name = "missing_source",
    outs = [
        "missing_source.h",
        "VERSION",
    ],
    cmd = "echo '{message}' >&2; exit 1",
)

cc_library(
    name = "{target}",
    hdrs = ["missing_source.h"],
)
""".format(message = message.replace("'", ""), target = rctx.attr.target))

def _gloo_config(rctx):
    # gloo/config.h as Gloo's CMake makes it from config.h.in, with Debian's macros
    # (/usr/include/gloo/config.h) but the TCP transport only: no CUDA, NCCL, ROCm, Redis,
    # ibverbs, MPI, libuv or TLS.
    versions = {}
    for line in rctx.read("CMakeLists.txt").split("\n"):
        for part in ["MAJOR", "MINOR", "PATCH"]:
            prefix = "set(GLOO_VERSION_%s " % part
            if line.startswith(prefix):
                versions[part] = line[len(prefix):].strip(" )")
    text = rctx.read("gloo/config.h.in")
    for part in ["MAJOR", "MINOR", "PATCH"]:
        if part not in versions:
            fail("gossipcc: no GLOO_VERSION_%s in gloo's CMakeLists.txt" % part)
        text = text.replace("@GLOO_VERSION_%s@" % part, versions[part])
    lines = []
    for line in text.split("\n"):
        if line.startswith("#cmakedefine01 "):
            name = line[len("#cmakedefine01 "):].strip()
            line = "#define %s %d" % (name, 1 if name == "GLOO_HAVE_TRANSPORT_TCP" else 0)
        lines.append(line)
    rctx.file("gloo/config.h", "\n".join(lines))

def _absl_options(rctx):
    # As Abseil's CMake install does for a C++17 build (Debian's /usr/include/absl/base/options.h):
    # "2" (choose at compile time) becomes 0 for the options whose std type needs C++20.
    text = rctx.read("absl/base/options.h")
    rctx.file("absl/base/options.h", text.replace("#define ABSL_OPTION_USE_STD_ORDERING 2", "#define ABSL_OPTION_USE_STD_ORDERING 0"))

def _debian_source_repository_impl(rctx):
    cache = rctx.os.environ.get("GOSSIPCC_SRC_CACHE", "/var/cache/gossipcc/src")
    entry = _manifest_entry(rctx, cache, rctx.attr.package)
    if not entry:
        _missing(rctx, cache, "{}/SOURCES lists no {}".format(cache, rctx.attr.package))
        return
    for tarball in [entry.orig, entry.debian]:
        if not rctx.path(tarball).exists:
            _missing(rctx, cache, "{} is missing".format(tarball))
            return
    result = rctx.execute(["sh", "-c", _UNPACK, "unpack", entry.orig, entry.debian], timeout = 300)
    if result.return_code != 0:
        fail("gossipcc: unpacking and patching {} {} failed: {}{}".format(rctx.attr.package, entry.version, result.stdout, result.stderr))
    if rctx.attr.package == "gloo":
        _gloo_config(rctx)
    elif rctx.attr.package == "abseil":
        _absl_options(rctx)
    rctx.file("VERSION", "{} {}\n".format(rctx.attr.package, entry.version))
    rctx.template("BUILD.bazel", rctx.attr.build_file, {"@VERSION@": entry.version})

debian_source_repository = repository_rule(
    implementation = _debian_source_repository_impl,
    attrs = {
        "package": attr.string(mandatory = True, doc = "Debian source package (a name in the SOURCES manifest)"),
        "target": attr.string(mandatory = True, doc = "the cc_library build_file defines"),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
    },
    environ = ["GOSSIPCC_SRC_CACHE"],
    # Reads files outside the workspace (the cache): look again on every fetch.
    local = True,
)
