"""``/usr/bin/python3 -m gossipcc.torchrun ...``: torch.distributed.run (torchrun), usable on Debian bookworm.

torch 1.13's launcher fails on Python >= 3.11 before starting any worker; this wrapper applies
_torch_patches.torchrun_std_from_str where this torch needs it, then runs torchrun unchanged;
on torch versions without the bug it changes nothing. Like `import gossipcc` (which running
this module does first), it defaults USE_LIBUV=0 where torch was built without libuv (Debian's
torch 2.x) and makes torchrun's own TCPStores honour it (_torch_patches).

It accepts both spellings of torchrun's own options on every torch: torch 2.x's launcher takes
`--nproc-per-node` and `--nproc_per_node` alike, torch 1.13's only the underscore one, so a
hyphen spelling that this torch's launcher does not know is rewritten to its underscore twin
before torchrun parses the command line. Only the launcher's options are rewritten, those before
the training script; the script's own arguments pass unchanged.
"""
import sys

from . import _torch_patches


def translate_flags(argv, parser):
    """argv (without the program name) with hyphen spellings of `parser`'s options that only
    exist with underscores rewritten, up to the training script (the first positional argument,
    or what follows "--"); everything from there on is returned unchanged."""
    known = {}  # option string -> takes a value
    for action in parser._actions:
        for opt in action.option_strings:
            known[opt] = action.nargs != 0
    out = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break  # the training script (or "--" before it): leave the rest alone
        name, eq, value = arg.partition("=")
        if name.startswith("--") and name not in known:
            twin = "--" + name[2:].replace("-", "_")
            if twin in known:
                name = twin
        out.append(name + eq + value)
        i += 1
        if not eq and known.get(name, False) and i < len(argv):
            out.append(argv[i])  # the option's value, in the next argument
            i += 1
    return out + argv[i:]


def main():
    if _torch_patches.std_from_str_is_broken():
        _torch_patches.torchrun_std_from_str()
    from torch.distributed.run import get_args_parser, main as torchrun_main
    torchrun_main(translate_flags(sys.argv[1:], get_args_parser()))


if __name__ == "__main__":
    main()
