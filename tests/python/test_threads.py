"""Python threads calling executables at once: the GIL is released while one runs, calls on one
executable take turns (its lock), and every thread gets its own inputs' outputs."""

import threading

import numpy as np

import fusebox


def test_threads_share_an_executable_and_run_two():
    model = fusebox.load("small_cnn", batch=2, image_size=16, num_classes=10)
    shared = fusebox.compile(model, device="cpu-ref")
    other = fusebox.compile(model, device="cpu-ref")
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, model.inputs[0].shape).astype(np.float32) for _ in range(4)]
    expected = [shared(x)[0] for x in inputs]
    failures = []

    def work(index, exe):
        for _ in range(50):
            (y,) = exe(inputs[index].copy())  # fresh arrays: released from other threads' runs
            if not np.array_equal(y, expected[index]):
                failures.append(index)

    threads = [threading.Thread(target=work, args=(i, shared if i % 2 else other))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures
