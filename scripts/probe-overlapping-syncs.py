#!/usr/bin/env python3
"""How a disk takes overlapping syncs: 1 to 4 threads, each writing 2.4 KB at the end of a
preallocated file and then fdatasync'ing it, as the log's rounds would. Prints syncs a second
and the median latency for each thread count. Run it on the data directory's disk, pinned as
the node runs (docs/performance.md, "two syncs a publish"):

    cd target && taskset -c 0 python3 ../scripts/probe-overlapping-syncs.py
"""
import os
import threading
import time

PATH, SIZE, CHUNK, SYNCS = "sync-probe.seg", 64 << 20, b"x" * 2400, 2000

if not os.path.exists(PATH) or os.path.getsize(PATH) != SIZE:
    with open(PATH, "wb") as f:
        f.write(b"\0" * SIZE)
        f.flush()
        os.fsync(f.fileno())
fd = os.open(PATH, os.O_RDWR)
lock, end = threading.Lock(), [0]


def next_place():
    with lock:
        place = end[0]
        end[0] += len(CHUNK)
        return place


def syncer(latencies):
    for _ in range(SYNCS):
        start = time.perf_counter()
        os.pwrite(fd, CHUNK, next_place())
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - start)


for threads in (1, 2, 3, 4):
    end[0] = 0
    latencies = [[] for _ in range(threads)]
    started = time.perf_counter()
    workers = [threading.Thread(target=syncer, args=(latencies[i],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    every = sorted(sum(latencies, []))
    print(f"threads={threads}: {threads * SYNCS / elapsed:.0f} syncs/s, "
          f"median latency {every[len(every) // 2] * 1e6:.0f} us")
os.unlink(PATH)
