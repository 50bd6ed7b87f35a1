#!/usr/bin/env python3
"""A model of prefill attention's issue turns (IssueTurns in src/cuda/device/ops/attention_wgmma.cuh), run over tiles
of random lengths in random interleavings, to check the named-barrier protocol without a GPU.

The two consumer warpgroups (128 threads each) take turns issuing a tile's MMAs: named barrier 2 is warpgroup 0's
turn, 3 warpgroup 1's. bar.sync(id, 256) counts 128 arrivals and waits for the phase to complete; bar.arrive counts
128 without waiting. Per tile warpgroup 1 hands over the first turn, and each passes the turn after every issue but
warpgroup 1 after its last. A tile of n key blocks has n + 1 issues per warpgroup. The model checks that the issues
alternate 0, 1, 0, 1, ... within every tile, that nothing deadlocks, and that both barriers end with no arrivals
pending (a pending one would let the next tile's first wait pass early). The mutations must fail it. The model
mirrors IssueTurns and attention_mainloop's n + 1 issues by hand: change it with them (scripts/pipeline_model.py
runs the same turns among the tile's stage waits and releases).

Usage: attention_turns_model.py [--interleavings 200] [--mutation none|pass-after-last|no-handover]
           [--expect clean|failure]
"""
import argparse
import random
import sys

from pipeline_model import exit_status

THREADS = 256  # KernelConfig::kConsumerThreads: the count of bar.sync / bar.arrive
FIRST_BARRIER = 2  # IssueTurns::kFirstBarrier


class NamedBarrier:
    def __init__(self):
        self.arrived, self.generation = 0, 0

    def arrive(self):  # one warpgroup: 128 threads; returns the phase it counted toward
        phase = self.generation
        self.arrived += 128
        if self.arrived == THREADS:
            self.arrived, self.generation = 0, self.generation + 1
        return phase


def warpgroup(wg, tiles, barriers, issues, mutation):
    """Yields a predicate to wait on before each step (None: go on); appends (tile, wg) to issues at each issue."""
    own, other = barriers[FIRST_BARRIER + wg], barriers[FIRST_BARRIER + 1 - wg]
    for tile, blocks in enumerate(tiles):
        if wg == 1 and mutation != "no-handover":
            other.arrive()  # hands warpgroup 0 the first turn
        for k in range(blocks + 1):
            phase = own.arrive()  # bar.sync: count, then wait for the phase to complete
            yield lambda phase=phase: own.generation > phase
            issues.append((tile, wg))
            last = k == blocks
            if not (last and wg == 1 and mutation != "pass-after-last"):
                other.arrive()
            yield None


def run(tiles, seed, mutation):
    """None if the protocol held, else what went wrong."""
    rng = random.Random(seed)
    barriers = {FIRST_BARRIER: NamedBarrier(), FIRST_BARRIER + 1: NamedBarrier()}
    issues = []
    actors = [{"run": warpgroup(wg, tiles, barriers, issues, mutation), "wait": None} for wg in (0, 1)]
    while actors:
        moved = False
        for actor in rng.sample(actors, len(actors)):
            for _ in range(rng.randint(1, 3)):
                if actor["wait"] is not None and not actor["wait"]():
                    break
                try:
                    actor["wait"] = next(actor["run"])
                except StopIteration:
                    actor["wait"] = "done"
                    break
                moved = True
        actors = [a for a in actors if a["wait"] != "done"]
        if actors and not moved:
            return f"deadlock after {len(issues)} issues"
    for tile, blocks in enumerate(tiles):
        order = [wg for t, wg in issues if t == tile]
        if order != [0, 1] * (blocks + 1):
            return f"tile {tile} of {blocks} blocks issued in the order {order}"
    for barrier_id, barrier in barriers.items():
        if barrier.arrived != 0:
            return f"named barrier {barrier_id} ends with {barrier.arrived} arrivals pending"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interleavings", type=int, default=200)
    parser.add_argument("--mutation", choices=("none", "pass-after-last", "no-handover"), default="none")
    parser.add_argument("--expect", choices=("clean", "failure"))
    args = parser.parse_args()
    failures = 0
    for seed in range(args.interleavings):
        tiles = [random.Random(seed * 7 + i).randint(1, 5) for i in range(3)]  # key blocks of 3 tiles in a row
        problem = run(tiles, seed, args.mutation)
        if problem is not None:
            failures += 1
            if failures == 1:
                print(f"interleaving {seed} (tiles of {tiles} key blocks): {problem}")
    print(f"attention issue turns, mutation {args.mutation}: {args.interleavings - failures} of "
          f"{args.interleavings} interleavings clean")
    return exit_status(args.expect, failures)


if __name__ == "__main__":
    sys.exit(main())
