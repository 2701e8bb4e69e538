"""Where the node's time goes on the SQS face, by part: reads `perf script -F ip,sym` output
of a `perf record --call-graph dwarf` of the node and prints each part's share of the
samples, a sample counting for the first frame from the leaf up that names one of the parts
(kernel samples count for the user frame that made the system call, mostly tokio's), with
the allocator's own share and the scheduler's (going to sleep in epoll_wait, waking a peer).

    perf record -F 2000 -g --call-graph dwarf,16384 -p NODE -o sqs.perf &
    taskset -c 1 target/release/bench sqs-sdk --messages 10000     # then stop perf with SIGINT
    perf script -i sqs.perf -F ip,sym > sqs.script
    python3 bench/sqs/profile_parts.py sqs.script
"""

import collections
import re
import sys

# (a text a frame's symbol holds, the part it is), the first match wins.
PARTS = [
    ("serde_json", "serde_json"),
    ("sigv4", "sigv4"),
    ("hmac", "sigv4"),
    ("sha2", "sigv4"),
    ("hyper::", "hyper"),
    ("httparse", "hyper"),
    ("http::header", "hyper"),
    ("dataplane::store", "store"),
    ("dataplane::engine", "engine"),
    ("dataplane::sqs::actions", "actions"),
    ("dataplane::sqs::replies", "actions"),
    ("dataplane::sqs", "sqs-mod"),
    ("tokio::", "tokio (and the kernel under it)"),
    ("md5", "md5"),
]
ALLOCATOR = {
    "_int_malloc", "malloc", "malloc_consolidate", "_int_free", "cfree",
    "unlink_chunk.constprop.0", "_int_free_merge_chunk", "_int_free_create_chunk", "realloc",
    "_int_realloc", "__libc_free", "__libc_malloc", "free", "__GI___libc_free",
    "__GI___libc_malloc", "tcache_put",
}
SCHEDULER = {"_raw_spin_unlock_irqrestore", "finish_task_switch.isra.0"}


def part(frames):
    for frame in frames:
        for text, name in PARTS:
            if text in frame:
                return name
    return "other"


def main():
    parts, samples, allocator, scheduler = collections.Counter(), 0, 0, 0
    for sample in open(sys.argv[1]).read().split("\n\n"):
        frames = [
            re.sub(r"^\s*[0-9a-f]+\s+", "", line).replace(" (inlined)", "")
            for line in sample.strip().split("\n")
            if line.strip()
        ]
        if not frames:
            continue
        samples += 1
        parts[part(frames)] += 1
        leaf = frames[0].split("@")[0]
        allocator += leaf in ALLOCATOR
        scheduler += leaf in SCHEDULER

    def share(n):
        return f"{100 * n / samples:.1f}%"

    print(f"{samples} samples; malloc family (self) {share(allocator)}; "
          f"scheduler (_raw_spin_unlock_irqrestore, finish_task_switch) {share(scheduler)}")
    print("by the first of these found from the leaf up: "
          + ", ".join(f"{name} {share(n)}" for name, n in parts.most_common()))


main()
