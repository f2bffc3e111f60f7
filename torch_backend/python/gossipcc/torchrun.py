"""``python3 -m gossipcc.torchrun ...``: torch.distributed.run (torchrun), usable on Debian bookworm.

torch 1.13's launcher fails on Python >= 3.11 before starting any worker ("'NoneType' object
has no attribute 'get'"): its Std.from_str looks flags up by iterating the IntFlag, which on
3.11 no longer yields NONE (0) or ALL (3). This wrapper fixes that lookup, then runs torchrun
unchanged; on torch versions without the bug it changes nothing. It also defaults USE_LIBUV=0
where torch was built without libuv (Debian's torch 2.x), as `import gossipcc` does.
"""
import re

from torch.distributed.elastic.multiprocessing import api as _api


def _needs_fix():
    return not any(s == 0 for s in _api.Std)


def _from_str(cls, vm):
    if re.fullmatch(r"[0-3]", vm):
        return cls(int(vm))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
        return {int(k): cls(int(v)) for k, v in (item.split(":") for item in vm.split(","))}
    raise ValueError(f"{vm} does not match: <0|1|2|3> or <local_rank:<0|1|2|3>,...>")


def main():
    # Sets USE_LIBUV=0 where torch lacks libuv (Debian's torch 2.x) and makes torchrun's own
    # TCPStores honour it.
    import gossipcc  # noqa: F401
    if _needs_fix():
        _api.Std.from_str = classmethod(_from_str)
    from torch.distributed.run import main as torchrun_main
    torchrun_main()


if __name__ == "__main__":
    main()
