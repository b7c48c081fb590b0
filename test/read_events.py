#!/usr/bin/env python3
"""Reads a TensorBoard event file with TensorBoard's own loaders (which check
every record's CRCs) and prints what it holds, one line per value, for
test/test_summary.c to compare. First the events as written
(LegacyEventFileLoader):
    version <file_version>
    scalar <tag> <step> <simple_value>
    histo <tag> <step> <min> <max> <num> <sum> <sum_squares> <#limits> <#buckets> <limit>:<count> ...
    events <count>
then as TensorBoard's dashboards see them after its migration (EventFileLoader):
    plugin <tag> <step> <plugin name> <value count>
Exits 77 with the reason when python3 cannot import tensorboard.
    read_events.py EVENT_FILE
"""
import sys

try:
    from tensorboard.backend.event_processing.event_file_loader import (
        EventFileLoader,
        LegacyEventFileLoader,
    )
    from tensorboard.util import tensor_util
except Exception as e:  # ImportError, or a broken install
    print(f"read_events.py: cannot import tensorboard: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        print("usage: read_events.py EVENT_FILE", file=sys.stderr)
        return 2
    count = 0
    for event in LegacyEventFileLoader(sys.argv[1]).Load():
        count += 1
        if event.HasField("file_version"):
            print(f"version {event.file_version}")
        for v in event.summary.value:
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                print(f"scalar {v.tag} {event.step} {v.simple_value!r}")
            elif kind == "histo":
                h = v.histo
                buckets = " ".join(f"{l!r}:{c!r}" for l, c in zip(h.bucket_limit, h.bucket) if c > 0)
                print(f"histo {v.tag} {event.step} {h.min!r} {h.max!r} {h.num!r} {h.sum!r} {h.sum_squares!r} "
                      f"{len(h.bucket_limit)} {len(h.bucket)} {buckets}")
            else:
                print(f"other {v.tag} {event.step} {kind}")
    print(f"events {count}")
    for event in EventFileLoader(sys.argv[1]).Load():
        for v in event.summary.value:
            n = len(tensor_util.make_ndarray(v.tensor).reshape(-1)) if v.HasField("tensor") else -1
            print(f"plugin {v.tag} {event.step} {v.metadata.plugin_data.plugin_name or '-'} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
