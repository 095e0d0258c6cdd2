"""Helper threads that cannot fail quietly: tests and benchmarks run their concurrent readers
through `run_all`, which raises the first exception any thread raised (in the caller's thread,
so the test fails with it) and fails if a thread is still running at the deadline (a hung read
is a failure, not a thread left behind)."""

import threading
import time


def run_all(target, args: list, timeout: float, what: str = "helper threads") -> list:
    """Call `target(arg)` for each of `args`, each on a thread of its own, all at once; their
    results in the order of `args`. Raises the first error of any of them, or AssertionError
    naming how many were still running after `timeout` seconds."""
    results = [None] * len(args)
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def guarded(i, arg):
        try:
            results[i] = target(arg)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            with lock:
                errors.append((i, e))

    threads = [threading.Thread(target=guarded, args=(i, a), daemon=True) for i, a in enumerate(args)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        i, first = errors[0]
        raise AssertionError(f"{what}: {len(errors)} of {len(args)} failed; the first ({args[i]!r}): {first!r}") from first
    hung = sum(t.is_alive() for t in threads)
    assert hung == 0, f"{what}: {hung} of {len(args)} still running after {timeout:.0f}s"
    return results
