#!/usr/bin/env python3
"""perf_thread.py: the inclusive share of each function in one thread's
samples, from `perf record --call-graph dwarf` data (perf report's
--children view does not filter by thread).

    perf record --call-graph dwarf,16384 -F 2000 -o perf.data PROGRAM ...
    perf report -i perf.data --no-children --sort pid -g none   # the threads' shares
    perf script -i perf.data --tid TID -F tid,ip,sym | python3 bench/perf_thread.py [N]

Prints the N (default 40) functions with the largest share of the
thread's samples, a function counted once per sample whatever its depth.
"""
import collections
import sys


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    inclusive = collections.Counter()
    samples = 0
    stack = set()
    for line in sys.stdin:
        if not line.strip():  # a blank line ends a sample
            if stack:
                samples += 1
                inclusive.update(stack)
            stack = set()
        elif line[0] in " \t":  # a frame: address, then the symbol
            parts = line.split()
            stack.add(parts[1] if len(parts) > 1 else parts[0])
    if stack:
        samples += 1
        inclusive.update(stack)
    print("samples", samples)
    for name, n in inclusive.most_common(top):
        print("%5.1f%% %s" % (100.0 * n / max(samples, 1), name))


if __name__ == "__main__":
    main()
