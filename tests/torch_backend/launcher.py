"""Runs a function on N local ranks, each its own process, and reports every rank's failure."""
import multiprocessing
import os
import pickle
import tempfile
import traceback


def _entry(fn, rank, world_size, init_file, parent_env, env, args, queue):
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for stacks on a hang
    try:
        # The parent's environment as of run_ranks (a forkserver child starts with the server's,
        # from its start), then the call's own variables.
        os.environ.clear()
        os.environ.update(parent_env)
        os.environ.update(env or {})
        os.environ["GOSSIPCC_TEST_INIT_FILE"] = init_file
        result = fn(rank, world_size, *args)
        # By value (plain pickle): through the queue a tensor would travel as a shared-memory
        # handle that the parent can open only while this process lives, and it may exit first
        # ("Connection reset by peer" in the parent).
        queue.put((rank, None, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, traceback.format_exc(), None))


def init_method():
    return "file://" + os.environ["GOSSIPCC_TEST_INIT_FILE"]


_CONTEXT = None


def _context():
    """Ranks are forked from a forkserver that has imported torch (and nothing else: no process
    group, no gossipcc, no thread), instead of spawned as fresh interpreters that each import
    torch (1-1.5 s of CPU each on the 2-core test machine, most of these tests' time). Each rank
    still imports gossipcc and runs fn in a process of its own, from a clean torch."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch"])
    return _CONTEXT


def run_ranks(fn, world_size, *args, env=None, timeout=120):
    """fn(rank, world_size, *args) on each rank; returns the list of results by rank.

    Raises AssertionError with every failing rank's traceback; kills ranks that do not
    finish within `timeout` seconds.
    """
    ctx = _context()
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        init_file = os.path.join(tmp, "init")
        parent_env = dict(os.environ)
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, init_file, parent_env, env, args, queue))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results, errors, reported = {}, [], set()
        import queue as queue_module
        try:
            for _ in range(world_size):
                rank, err, result = queue.get(timeout=timeout)
                reported.add(rank)
                if err:
                    errors.append(f"rank {rank}:\n{err}")
                else:
                    results[rank] = pickle.loads(result)
        except queue_module.Empty:
            errors.append(f"ranks {sorted(set(range(world_size)) - reported)} did not finish in {timeout}s")
        if errors and any(p.is_alive() for p in procs):
            import signal
            import time
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGUSR1)  # Python stacks of every thread, to stderr
            time.sleep(2)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        if errors:
            raise AssertionError("\n".join(errors))
        return [results[r] for r in range(world_size)]
