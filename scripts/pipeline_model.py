#!/usr/bin/env python3
"""A protocol model of the megakernel's per-SM pipeline, run over a real schedule to find failures without a GPU.

Each SM has five actors, as in src/cuda/megakernel.cu: the counter poller (waits on the counters of the producer's
instructions in order and reports each through a ring of ready / ready_free mbarriers), the producer (stage-ring and
output-tile loads, activations only once the poller reported their counters met), two consumer warpgroups (stage
waits and releases, output-tile waits, row-wise counter waits behind a named barrier) and the storer (stores staged
output tiles, frees the tile, publishes). The stage ring is kNumStages stages (src/cuda/device/config.cuh), each with
a full and an empty mbarrier: a GEMM tile's k-step kb takes one stage (its A and B slices), and an attention tile's
K(j) sits at its ring position 2j and V(j) at 2j + 1. A wide GEMM tile (256 plain columns) keeps the stage of its
last k-step for its second output half: the consumers do not release it; once both warpgroups' last MMAs have read it
(a named barrier, take_held_stage) they write that half into it (onto the second residual half, which they load there
themselves; that load is not modelled), and the storer stores it from there and releases it for every consumer warp.
Their mbarriers are modelled with phases and parity waits, exactly as mbarrier.try_wait.parity behaves: a waiter two
phases behind sees the wrong phase. Actors advance in random interleavings (seeded, so a result repeats); a round in
which no actor can move is a deadlock, reported with what the blocked actors wait on. Silent corruption on the GPU
fails too: a load or write into the output tile before the store of its previous use has read it; a load into a stage
the producer has not claimed (waited empty for) in that lap; and a stage read for another operand than it holds. The
producer records what it claimed each stage for (instruction, and k-step kb or K(j) / V(j)), the consumers check it
when their full wait passes, and the storer checks a wide tile's held stage holds its second half: the full and empty
barriers complete once a lap whatever went into the stage, so a producer and consumers that disagree on an operand's
place pass every phase check.

Decode passes (--decode) have no GEMM or attention tiles, so producer and storer idle; the poller walks every
instruction of the SM and reports it to the consumers through the same ring: consumer thread 0 waits on the slot,
both warpgroups pass the named barrier, then thread 0 frees the slot. A reader that takes another instruction's
report, or a report of counters not met (its inputs not yet published), fails. Linked decode combines are skipped by
both: the attention task that takes its group's last ticket runs the combine and publishes its counter
(run_combine_if_last).

The model mirrors the kernel's waits by hand (produce_gemm, produce_attention, gemm_mainloop, attention_mainloop,
take_held_stage, stage_output, store_output_tile, run_counter_poller, poll_and_report, take_ready, and run_consumers'
row-wise path through consumers_wait in src/cuda/device/sync.cuh, and run_combine_if_last): change it with them. It
found the fifth session's stall, where the producer waited for the output tile by parity (`--producer-waits parity`
brings that rule back); `--poller laps` lets the poller report without waiting for a free slot of its ring and
`--poller early` report before the counters are met, which must fail too, in forward and decode passes; `--held-stage
unreleased` has the storer keep a wide tile's held stage, which must deadlock; `--ring early-fill` has the producer
wait for a stage's release with the parity of the lap before; `--attention-positions swapped` has the producer put
V(j) at position 2j and K(j) at 2j + 1 (same positions, same order), which only the content check finds. Attention's
consumers take turns issuing their MMAs (IssueTurns, named barriers 2 and 3) among their stage waits and releases, as
the kernel does.

Usage: pipeline_model.py --mk build/mk --preset tiny --batch 18 --seq 384 [--sms 132] [--interleavings 16]
           [--producer-waits count|parity] [--poller kernel|laps|early] [--held-stage kernel|unreleased]
           [--ring kernel|early-fill] [--attention-positions kernel|swapped] [--expect clean|failure]
       pipeline_model.py --decode --preset llama-3.2-1b --batch 1 --max-context 1024 [...]
"""
import argparse
import pathlib
import random
import subprocess
import sys
import tempfile

from pipeline_sync import (MBarrier, NamedBarrier, ProtocolViolation, Ring, ROOT, describe, describe_entry,
                           exact_wait, load_schedule, stage_count)

GEMMS = {"kQkv", "kOProj", "kGateUp", "kDown", "kLmHead"}
RESIDUAL = {"kOProj", "kDown"}
COMBINE_RUN_BY_LAST_ATTENTION, ATTENTION_RUNS_COMBINE = 1, 2  # Instruction::flags
TILE_OPS = GEMMS | {"kAttention"}  # through the stage ring and the output tile; every other op is the consumers' alone


class Model:
    def __init__(self, header, sm_begin, instructions, waits, producer_parity, poller="kernel", held_stage="kernel",
                 ring="kernel", attention_positions="kernel"):
        self.header, self.sm_begin, self.ins, self.waits = header, sm_begin, instructions, waits
        self.stages = stage_count()
        self.producer_parity, self.poller_mode, self.held_mode = producer_parity, poller, held_stage
        self.ring_mode, self.positions_mode = ring, attention_positions
        c = header["config"]
        q_dim = c["n_heads"] * c["head_dim"]
        self.k = {"kQkv": c["d_model"], "kOProj": q_dim, "kGateUp": c["d_model"], "kDown": c["d_ff"],
                  "kLmHead": c["d_model"]}
        self.block_k = header["tiles"]["block_k"]
        self.block_n = header["tiles"]["block_n"]
        self.block_kv = header["tiles"]["block_kv"]
        self.counters = {}
        self.decode = header["pass"] == "decode"
        # Linked decode combines (include/mk/instruction.h): tickets taken per combine, and the tasks that take them.
        self.tickets = {}
        self.ticket_takers = {}
        for x in instructions:
            if x["flags"] & ATTENTION_RUNS_COMBINE:
                self.ticket_takers[x["combine"]] = self.ticket_takers.get(x["combine"], 0) + 1

    def skipped(self, x):  # skipped_in_decode: a linked combine, run by its last attention task instead
        return self.decode and x["flags"] & COMBINE_RUN_BY_LAST_ATTENTION

    def wide(self, x):  # is_wide_gemm: a plain GEMM tile of more than kBlockN columns
        return x["op"] in GEMMS and x["op"] != "kGateUp" and x["cols"][1] - x["cols"][0] > self.block_n

    def met(self, x):
        begin, count = x["waits"]
        return all(self.counters.get(c, 0) >= t for c, t in self.waits[begin:begin + count])

    def publish(self, x):
        self.counters[x["signal"]] = self.counters.get(x["signal"], 0) + 1

    def kv_blocks(self, x):
        query_end = x["rows"][1] - x["sequence"] * self.header["seq_len"]
        return (query_end + self.block_kv - 1) // self.block_kv

    def poller(self, sm, order):
        ready = Ring(self.stages)  # the poller's cursor over the ready ring
        for i in order:
            x = self.ins[i]
            if (x["op"] not in TILE_OPS and not self.decode) or self.skipped(x):  # decode: every instruction run here
                continue
            if self.poller_mode != "early":
                yield ("poller: counters", i), lambda x=x: self.met(x)
            stage, parity = ready.stage, ready.phase ^ 1
            if self.poller_mode != "laps":
                yield ("poller: ready slot free", i), lambda: sm.ready_free[stage].passed(parity)
            sm.reported[stage] = i
            sm.ready[stage].arrive(32)  # every lane
            ready.advance()

    def check_report(self, sm, stage, x, i, reader):  # what the reader acquired: this instruction's counters met
        if sm.reported[stage] != i:
            raise ProtocolViolation(f"schedule instruction {i}: {reader} took the report of instruction "
                                    f"{sm.reported[stage]} in its slot")
        if not self.met(x):
            raise ProtocolViolation(f"schedule instruction {i}: {reader} took its report before its counters were "
                                    f"met, and would read inputs not yet published")

    def take_ready(self, sm, ready, x, i):  # a look: whether the poller's report came; if so taken, its slot freed
        if not sm.ready[ready.stage].passed(ready.phase):
            return False
        self.check_report(sm, ready.stage, x, i, "the producer")
        sm.ready_free[ready.stage].arrive()
        ready.advance()
        return True

    def wait_ready(self, sm, ready, x, i):
        stage, parity = ready.stage, ready.phase
        yield ("producer: the poller's report", i), lambda: sm.ready[stage].passed(parity)
        self.take_ready(sm, ready, x, i)

    def producer(self, sm, order):
        ring, uses, ready = Ring(self.stages), 0, Ring(self.stages)
        for i in order:
            x = self.ins[i]
            if x["op"] not in TILE_OPS:
                continue
            if x["op"] == "kAttention":
                yield from self.wait_ready(sm, ready, x, i)
                yield ("producer: output tile free (Q)", i), self.tile_free(sm, uses)
                self.check_freed(sm, uses, i, "the producer loads Q")
                sm.loaded.expect_and_arrive(1)
                sm.loaded.land(1)
                yield from self.produce_key_blocks(sm, ring, x, i)
            else:
                yield from self.produce_gemm(sm, ring, ready, x, i)
                if x["op"] in RESIDUAL:
                    yield ("producer: output tile free (residual)", i), self.tile_free(sm, uses)
                    self.check_freed(sm, uses, i, "the producer loads a residual")
                    sm.loaded.expect_and_arrive(1)
                    sm.loaded.land(1)
            uses += 1

    def produce_gemm(self, sm, ring, ready, x, i):
        """produce_gemm: k-step kb of the tile in one stage (its A and B slices). The first stages (as many k-steps as
        the ring holds) are claimed and their weights requested before the activation counters are met; the poller's
        report is looked for after each claim, and the claimed stages' A slices go out once it came (load_a_slices);
        the later k-steps' A and B at once."""
        blocks = self.k[x["op"]] // self.block_k
        prefetched, first, issued, met = min(blocks, self.stages), ring.copy(), 0, False
        for kb in range(prefetched):
            yield from self.fill(sm, ring, i, ("k-step", kb), 2)
            met = met or self.take_ready(sm, ready, x, i)  # a look, not a wait
            if met:
                issued = self.land_a(sm, first, issued, kb + 1, x, i)
        if not met:
            yield from self.wait_ready(sm, ready, x, i)
            self.land_a(sm, first, issued, prefetched, x, i)
        for kb in range(prefetched, blocks):
            yield from self.fill(sm, ring, i, ("k-step", kb), 1)

    def land_a(self, sm, first, issued, upto, x, i):
        """load_a_slices: the A slices of k-steps [issued, upto), into the claimed stages from `first` on."""
        if not self.met(x):
            raise ProtocolViolation(f"schedule instruction {i}: the producer loads activations before their counters "
                                    f"are met")
        for kb in range(issued, upto):
            self.land(sm, first, i, ("k-step", kb))
            first.advance()
        return upto

    def produce_key_blocks(self, sm, ring, x, i):
        """produce_attention's order: K0 V0 K1, then K(j+1) before V(j), though K(j) sits at ring position 2j and
        V(j) at 2j + 1 (K leads by up to two blocks, by one until V0 is out). `--attention-positions swapped` (a
        mutation) fills the same positions in the same order but puts V(j) at 2j and K(j) at 2j + 1: every barrier
        completes as before, so only the consumers' content check sees it."""
        blocks, keys, values = self.kv_blocks(x), 0, 0
        while values < blocks:
            send_key = keys < blocks and keys - values < (1 if values == 0 else 2)
            block = keys if send_key else values
            at = ring.copy()
            for _ in range(2 * block + (0 if send_key else 1)):
                at.advance()
            if self.positions_mode == "swapped":  # the mutation: the other kind's block at this position
                kind = "V" if send_key else "K"
            else:
                kind = "K" if send_key else "V"
            yield from self.fill(sm, at, i, (kind, block), 1)
            keys, values = (keys + 1, values) if send_key else (keys, values + 1)
        for _ in range(2 * blocks):
            ring.advance()

    def fill(self, sm, ring, i, content, tx):
        """Claims the stage at the ring's position (waits for its release by every consumer warp, exactly its lap's)
        for `content` of instruction i, expects tx transactions and lands one now (a prefetch's A lands later)."""
        stage, parity = ring.stage, ring.phase ^ 1
        if self.ring_mode == "early-fill" and ring.lap > 0:
            parity = ring.phase  # a mutation: the parity of the lap before, which passes a lap early
        what = f"schedule instruction {i}: the producer's wait for stage {stage} empty"
        yield ("producer: stage empty", i), exact_wait(sm.empty[stage], parity, ring.lap, what)
        sm.claimed[stage], sm.content[stage] = ring.lap, (i, content)
        sm.full[stage].expect_and_arrive(tx)
        self.land(sm, ring, i, content)
        ring.advance()

    def land(self, sm, ring, i, content):
        """A load of `content` landing in the stage at the ring's position: the producer must have claimed that stage
        in this lap, and for this content (an A slice goes beside its own k-step's B), or it overwrites a stage the
        consumers may still read, which no barrier shows."""
        stage = ring.stage
        if sm.claimed[stage] != ring.lap:
            raise ProtocolViolation(f"schedule instruction {i}: a load of {describe(content)} into stage {stage} "
                                    f"(lap {ring.lap}) before the producer claimed it")
        if sm.content[stage] != (i, content):
            raise ProtocolViolation(f"schedule instruction {i}: a load of {describe(content)} into stage {stage}, "
                                    f"claimed for {describe_entry(sm.content[stage])}")
        sm.full[stage].land(1)

    def check_freed(self, sm, uses, i, what):
        if sm.free.phase < uses:
            raise ProtocolViolation(f"schedule instruction {i}: {what} into the output tile before the store of use "
                                f"{uses - 1} has read it ({sm.free.phase} of {uses} uses freed)")

    def tile_free(self, sm, uses):
        if self.producer_parity:
            parity = (uses & 1) ^ 1
            return lambda: sm.free.passed(parity)
        return lambda: sm.free.phase >= uses  # the storer's count (wait_output_freed)

    def consumer(self, sm, order, warpgroup):
        ring, uses, loads, reported = Ring(self.stages), 0, 0, Ring(self.stages)
        for i in order:
            x = self.ins[i]
            if self.skipped(x):
                continue
            if x["op"] not in TILE_OPS:  # row-wise and decode ops
                yield from self.rowwise(sm, warpgroup, x, i, reported)
                continue
            if x["op"] == "kAttention":
                yield (f"consumers {warpgroup}: Q loaded", i), (lambda p=loads & 1: sm.loaded.passed(p))
                yield from self.consume_attention(sm, warpgroup, ring, x, i)
                loads += 1
            else:
                held = yield from self.consume_gemm(sm, warpgroup, ring, x, i)
                yield (f"consumers {warpgroup}: output tile free", i), \
                    (lambda p=(uses & 1) ^ 1: sm.free.passed(p))
                if x["op"] in RESIDUAL:
                    yield (f"consumers {warpgroup}: residual loaded", i), (lambda p=loads & 1: sm.loaded.passed(p))
                    loads += 1
                self.check_freed(sm, uses, i, f"consumers {warpgroup} write")
                if held is not None:
                    self.write_held_stage(sm, warpgroup, held, x, i)
            sm.staged.arrive(4)
            uses += 1

    def wait_full(self, sm, warpgroup, r, i, content):
        """The consumers' wait for the stage at r's position, exactly its lap's fill; then what they read there must be
        what they expect: the barriers complete once a lap whatever the producer put in the stage, so only this shows
        a producer and consumers that disagree on an operand's place."""
        stage, what = r.stage, describe(content)
        yield (f"consumers {warpgroup}: {what}", i), exact_wait(
            sm.full[stage], r.phase, r.lap + 1, f"schedule instruction {i}: consumers {warpgroup}' wait for {what}")
        if sm.content[stage] != (i, content):
            raise ProtocolViolation(f"schedule instruction {i}: consumers {warpgroup} read {what} from stage {stage}, "
                                    f"which holds {describe_entry(sm.content[stage])}")

    def consume_attention(self, sm, warpgroup, ring, x, i):
        """attention_mainloop: K(j) at ring position 2j of the tile and V(j) at 2j + 1, so a cursor over one kind
        steps over the other's stage; the issue turns come between, as in the kernel. Leaves `ring` after the tile."""
        def release(stage):
            sm.empty[stage].arrive(4)  # one arrival per warp

        blocks = self.kv_blocks(x)
        key, value = ring.copy(), ring.copy()
        value.advance()
        yield from self.wait_full(sm, warpgroup, key, i, ("K", 0))
        if warpgroup == 1:
            sm.turns[0].arrive()  # IssueTurns: warpgroup 1 hands warpgroup 0 the first turn
        yield from self.issue_turn(sm, warpgroup, i, last=False)  # S = Q K0^T
        release(key.stage)
        key.next_block()
        yield from self.wait_full(sm, warpgroup, value, i, ("V", 0))
        if blocks > 1:
            yield from self.wait_full(sm, warpgroup, key, i, ("K", 1))
        for j in range(1, blocks):
            yield from self.issue_turn(sm, warpgroup, i, last=False)  # S = Q Kj^T, O += P V(j-1)
            pending = value.stage
            value.next_block()
            release(key.stage)
            key.next_block()
            yield from self.wait_full(sm, warpgroup, value, i, ("V", j))
            if j + 1 < blocks:
                yield from self.wait_full(sm, warpgroup, key, i, ("K", j + 1))
            release(pending)
        yield from self.issue_turn(sm, warpgroup, i, last=True)  # O += P V(n-1)
        release(value.stage)
        for _ in range(2 * blocks):
            ring.advance()

    def consume_gemm(self, sm, warpgroup, ring, x, i):
        """gemm_mainloop: k-step kb in the stage at the tile's ring position kb, each released after the next step's
        MMA, the last after the loop; but a wide tile keeps its last stage for its second output half, once both
        warpgroups' last MMAs have read it (take_held_stage's named barrier). Returns that stage, or None."""
        previous = None
        for kb in range(self.k[x["op"]] // self.block_k):
            yield from self.wait_full(sm, warpgroup, ring, i, ("k-step", kb))
            if previous is not None:
                sm.empty[previous].arrive(4)  # one arrival per warp
            previous = ring.stage
            ring.advance()
        if not self.wide(x):
            sm.empty[previous].arrive(4)
            return None
        sm.arrived[warpgroup] += 1
        yield (f"consumers {warpgroup}: named barrier (held stage)", i), \
            (lambda n=sm.arrived[warpgroup]: min(sm.arrived) >= n)
        return previous

    def write_held_stage(self, sm, warpgroup, held, x, i):
        """A wide tile's second output half, written into its held stage, which must still hold the tile's last k-step
        (or the half the other warpgroup wrote); the storer reads it from there (store_output_tile)."""
        last = ("k-step", self.k[x["op"]] // self.block_k - 1)
        if sm.content[held] not in ((i, last), (i, "second output half")):
            raise ProtocolViolation(f"schedule instruction {i}: consumers {warpgroup} write the second output half "
                                    f"into stage {held}, which holds {describe_entry(sm.content[held])}")
        sm.content[held] = (i, "second output half")
        sm.held[warpgroup] = held  # the held_stage word, published by the staged arrive

    def rowwise(self, sm, warpgroup, x, i, reported):
        """consumers_wait, the op, publish. Consumer thread 0 (in warpgroup 0) waits: on the counters in a forward
        pass, on the poller's report in a decode pass, whose slot it frees only after the named barrier, which hands
        every consumer thread the wait's outcome (and so tells thread 0 whether all are healthy)."""
        stage, parity = reported.stage, reported.phase
        if warpgroup == 0 and self.decode:
            yield ("consumers 0: the poller's report", i), lambda: sm.ready[stage].passed(parity)
            self.check_report(sm, stage, x, i, "the consumers")
        elif warpgroup == 0:
            yield ("consumers 0: counters", i), lambda: self.met(x)
        sm.arrived[warpgroup] += 1
        yield (f"consumers {warpgroup}: named barrier", i), (lambda n=sm.arrived[warpgroup]: min(sm.arrived) >= n)
        if self.decode:
            if warpgroup == 0:
                sm.ready_free[stage].arrive()
            reported.advance()
        sm.published[warpgroup] += 1
        yield (f"consumers {warpgroup}: publish barrier", i), \
            (lambda n=sm.published[warpgroup]: min(sm.published) >= n)
        if warpgroup == 0:
            self.publish(x)
        if self.decode and x["flags"] & ATTENTION_RUNS_COMBINE:
            yield from self.combine_if_last(sm, warpgroup, x, i)

    def combine_if_last(self, sm, warpgroup, x, i):
        """run_combine_if_last: thread 0 takes a ticket, both warpgroups pass a named barrier to learn whether it was
        the group's last; if so they run the combine and publish its counter (one more barrier)."""
        if warpgroup == 0:
            taken = self.tickets.get(x["combine"], 0) + 1
            self.tickets[x["combine"]] = taken
            sm.last_of_group = taken == self.ticket_takers[x["combine"]]
        sm.arrived[warpgroup] += 1
        yield (f"consumers {warpgroup}: ticket barrier", i), (lambda n=sm.arrived[warpgroup]: min(sm.arrived) >= n)
        if not sm.last_of_group:
            return
        sm.published[warpgroup] += 1
        yield (f"consumers {warpgroup}: combine's publish barrier", i), \
            (lambda n=sm.published[warpgroup]: min(sm.published) >= n)
        if warpgroup == 0:
            self.counters[x["combine_signal"]] = self.counters.get(x["combine_signal"], 0) + 1

    def issue_turn(self, sm, warpgroup, i, last):
        """IssueTurns: wait for this warpgroup's turn (bar.sync on its barrier), issue, pass the turn (bar.arrive on the
        other's), but warpgroup 1 not after its last issue."""
        phase = sm.turns[warpgroup].arrive()
        yield (f"consumers {warpgroup}: issue turn", i), lambda: sm.turns[warpgroup].generation > phase
        if not (last and warpgroup == 1):
            sm.turns[1 - warpgroup].arrive()

    def storer(self, sm, order):
        uses = 0
        for i in order:
            x = self.ins[i]
            if x["op"] not in TILE_OPS:
                continue
            yield ("storer: staged", i), (lambda p=uses & 1: sm.staged.passed(p))
            sm.free.arrive()
            if self.wide(x):
                if sm.held[0] != sm.held[1]:
                    raise ProtocolViolation(f"schedule instruction {i}: the warpgroups held different stages "
                                            f"{sm.held}")
                if sm.content[sm.held[0]] != (i, "second output half"):
                    raise ProtocolViolation(f"schedule instruction {i}: the storer stores the second output half from "
                                            f"stage {sm.held[0]}, which holds {describe_entry(sm.content[sm.held[0]])}")
                if self.held_mode == "kernel":
                    sm.empty[sm.held[0]].arrive(8)  # on behalf of every consumer warp
            uses += 1
            self.publish(x)


class SmState:
    def __init__(self, stages):
        self.full = [MBarrier(1) for _ in range(stages)]
        self.empty = [MBarrier(8) for _ in range(stages)]  # every consumer warp
        self.claimed = [None] * stages  # the lap of each stage's last claim by the producer
        self.content = [None] * stages  # and what it holds: (instruction, ("k-step", kb) | ("K"|"V", j) | "second ...")
        self.staged, self.free, self.loaded = MBarrier(8), MBarrier(1), MBarrier(1)
        self.ready = [MBarrier(32) for _ in range(stages)]  # every poller lane
        self.ready_free = [MBarrier(1) for _ in range(stages)]
        self.reported = [None] * stages  # the instruction each ready slot last reported
        self.turns = [NamedBarrier(), NamedBarrier()]  # named barriers 2 and 3: warpgroup 0's and 1's issue turn
        self.arrived, self.published = [0, 0], [0, 0]
        self.held = [None, None]  # each warpgroup's held stage of its current wide GEMM tile
        self.last_of_group = False  # decode: did the SM's linked attention task take its group's last ticket


def interleave(schedule, producer_parity, seed, poller="kernel", held_stage="kernel", ring="kernel",
               attention_positions="kernel"):
    """One random interleaving: None if every actor finishes, else what went wrong: the blocked actors' waits (a
    deadlock), or the protocol violation met (ProtocolViolation)."""
    header, sm_begin, instructions, _ = schedule
    model = Model(*schedule, producer_parity, poller, held_stage, ring, attention_positions)
    rng = random.Random(seed)
    actors = []
    for sm_index in range(header["num_sms"]):
        sm = SmState(model.stages)
        order = range(sm_begin[sm_index], sm_begin[sm_index + 1])
        for actor in (model.poller(sm, order), model.producer(sm, order), model.storer(sm, order),
                      model.consumer(sm, order, 0), model.consumer(sm, order, 1)):
            actors.append({"sm": sm_index, "run": actor, "wait": None})
    while actors:
        rng.shuffle(actors)
        moved = False
        for actor in actors:
            for _ in range(rng.randint(1, 4)):
                try:
                    if actor["wait"] is not None and not actor["wait"][1]():  # exact_wait raises on a wrong phase
                        break
                    actor["wait"] = next(actor["run"])
                except StopIteration:
                    actor["wait"] = "done"
                except ProtocolViolation as overwrite:
                    return [f"SM {actor['sm']} {overwrite}"]
                moved = True
                if actor["wait"] == "done":
                    break
        actors = [a for a in actors if a["wait"] != "done"]
        if actors and not moved:
            blocked = []
            for a in actors:
                (what, i) = a["wait"][0]
                x = instructions[i]
                blocked.append(f"SM {a['sm']} instruction {i - sm_begin[a['sm']]} ({x['op'][1:]} L{x['layer']} "
                               f"rows [{x['rows'][0]},{x['rows'][1]})): {what}")
            tile_waits = ("output tile", "staged", "loaded", "report", "turn")
            return sorted(blocked, key=lambda line: not any(w in line for w in tile_waits))
    return None


def exit_status(expect, failures):
    """The exit status of a model run: 1 when --expect clean met a failure or --expect failure met none."""
    return int((expect == "clean" and failures > 0) or (expect == "failure" and failures == 0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mk", default=str(ROOT / "build/mk"), help="the mk binary, to build the schedule")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=18)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--decode", action="store_true", help="a decode step of --batch sequences instead")
    parser.add_argument("--max-context", type=int, default=128, help="--decode: KV cache positions")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--interleavings", type=int, default=16)
    parser.add_argument("--producer-waits", choices=("count", "parity"), default="count",
                        help="how the producer waits for the output tile: the kernel's count, or the old parity")
    parser.add_argument("--poller", choices=("kernel", "laps", "early"), default="kernel",
                        help="the kernel's counter poller, or a mutation: it reports without waiting for a free slot "
                             "of its ring (laps) or before the counters are met (early)")
    parser.add_argument("--held-stage", choices=("kernel", "unreleased"), default="kernel",
                        help="the storer releases a wide tile's held stage as the kernel does, or (a mutation) not")
    parser.add_argument("--ring", choices=("kernel", "early-fill"), default="kernel",
                        help="the producer waits for a stage's release as the kernel does, or (a mutation) with the "
                             "parity of the lap before, which a parity wait passes a lap early")
    parser.add_argument("--attention-positions", choices=("kernel", "swapped"), default="kernel",
                        help="the producer puts attention's K(j) at ring position 2j and V(j) at 2j + 1 as the kernel "
                             "does, or (a mutation) V(j) at 2j and K(j) at 2j + 1, in the same order of positions")
    parser.add_argument("--expect", choices=("clean", "failure"),
                        help="exit 1 unless every interleaving is clean, or unless one fails")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        path = pathlib.Path(work) / "schedule.bin"
        shape = ["--decode", "--max-context", str(args.max_context)] if args.decode else ["--seq", str(args.seq)]
        subprocess.run([args.mk, "schedule", "--preset", args.preset, "--batch", str(args.batch), *shape, "--sms",
                        str(args.sms), "--out", str(path)], check=True, stdout=subprocess.DEVNULL)
        schedule = load_schedule(path)
    failures = 0
    for seed in range(args.interleavings):
        blocked = interleave(schedule, args.producer_waits == "parity", seed, args.poller, args.held_stage, args.ring,
                             args.attention_positions)
        if blocked is not None:
            failures += 1
            if failures == 1:
                print(f"interleaving {seed}: {len(blocked)} failures, e.g.")
                for line in blocked[:6]:
                    print("  " + line)
    poller = "" if args.poller == "kernel" else f", poller mutation '{args.poller}'"
    poller += "" if args.held_stage == "kernel" else f", held stage '{args.held_stage}'"
    poller += "" if args.ring == "kernel" else f", ring '{args.ring}'"
    poller += "" if args.attention_positions == "kernel" else f", attention positions '{args.attention_positions}'"
    shape = f"decode batch {args.batch} max context {args.max_context}" if args.decode else \
        f"batch {args.batch} seq {args.seq}, producer waits by {args.producer_waits}"  # decode: the producer idles
    print(f"{args.preset} {shape} on {args.sms} SMs{poller}: {args.interleavings - failures} of "
          f"{args.interleavings} interleavings clean")
    return exit_status(args.expect, failures)


if __name__ == "__main__":
    sys.exit(main())
