"""The pieces scripts/pipeline_model.py runs the kernel's roles over: the schedule file's reader, the shared-memory
mbarriers and named barriers with the kernel's phase and parity rules, the stage ring's position, and the exception a
silent corruption raises."""
import json
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent


def opcode_names():
    """Opcode numbers -> names, read from include/mk/instruction.h so that the model follows the enum."""
    text = (ROOT / "include/mk/instruction.h").read_text()
    body = text[text.index("enum class Opcode"):]
    body = body[body.index("{") + 1:body.index("};")]
    return re.findall(r"^\s*(k\w+)", body, re.M)


def stage_count():
    text = (ROOT / "src/cuda/device/config.cuh").read_text()
    return int(re.search(r"kNumStages\s*=\s*(\d+)", text).group(1))


def load_schedule(path):
    data = pathlib.Path(path).read_bytes()
    if data[:8] != b"MKSCHED3":
        raise SystemExit(f"{path}: not a schedule of the version this model reads (src/host/schedule.cc)")
    length = struct.unpack("<Q", data[8:16])[0]
    header = json.loads(data[16:16 + length])
    if header["pass"] not in ("forward", "decode") or header["num_instructions"] == 0:
        raise SystemExit(f"{path}: the model covers forward and decode passes, got an empty or {header['pass']} "
                         f"schedule")
    at = 16 + length
    sms = header["num_sms"]
    sm_begin = struct.unpack(f"<{sms + 1}I", data[at:at + 4 * (sms + 1)])
    at += 4 * (sms + 1)
    names = opcode_names()
    instructions = []
    for _ in range(header["num_instructions"]):
        f = struct.unpack("<BBHIiiiiiiIIIII3I", data[at:at + 64])
        at += 64
        instructions.append({"op": names[f[0]], "flags": f[1], "layer": f[2], "rows": (f[4], f[5]),
                             "cols": (f[6], f[7]), "sequence": f[8], "signal": f[10], "waits": (f[11], f[12]),
                             "combine": f[13], "combine_signal": f[14]})
    waits = [struct.unpack("<II", data[at + 8 * i:at + 8 * i + 8]) for i in range(header["num_waits"])]
    return header, sm_begin, instructions, waits


class MBarrier:
    """Arrival count and transaction bytes per phase; `phase` counts completed phases."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._complete()

    def expect_and_arrive(self, tx):
        self.tx += tx
        self.arrive()

    def land(self, tx):
        self.tx -= tx
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):  # mbarrier.try_wait.parity: the last phase of that parity has completed
        return (self.phase & 1) != parity


class NamedBarrier:
    """bar.sync / bar.arrive over the two consumer warpgroups (256 threads): a phase completes at two arrivals."""

    def __init__(self):
        self.arrived, self.generation = 0, 0

    def arrive(self):  # one warpgroup's; returns the phase it counted toward
        phase = self.generation
        self.arrived += 1
        if self.arrived == 2:
            self.arrived, self.generation = 0, self.generation + 1
        return phase


class Ring:
    """Position in the stage ring, advanced alike by producer and consumers (PipelineState); `lap` counts the wraps,
    of which the kernel keeps only the parity, its phase."""

    def __init__(self, stages, stage=0, lap=0):
        self.stages, self.stage, self.lap = stages, stage, lap

    @property
    def phase(self):
        return self.lap & 1

    def advance(self):
        self.stage += 1
        if self.stage == self.stages:
            self.stage, self.lap = 0, self.lap + 1

    def copy(self):
        return Ring(self.stages, self.stage, self.lap)

    def next_block(self):  # attention's K and V blocks alternate: a cursor over one kind skips the other
        self.advance()
        self.advance()


def exact_wait(barrier, parity, completed, what):
    """A parity wait that must pass on exactly `completed` phases of the barrier: a parity wait passes on any phase of
    its parity, so one two phases behind (or ahead) passes silently on the GPU."""
    def ready():
        if not barrier.passed(parity):
            return False
        if barrier.phase != completed:
            raise ProtocolViolation(f"{what}: passed with {barrier.phase} phases of the barrier completed, meant "
                                    f"{completed}")
        return True
    return ready


def describe(content):  # what a stage holds, for a report: ("k-step", 3) -> "k-step 3", ("K", 2) -> "K2"
    if isinstance(content, str):
        return content
    return f"{content[0]} {content[1]}" if content[0] == "k-step" else f"{content[0]}{content[1]}"


def describe_entry(entry):  # a stage's (instruction, content), or None before its first claim
    return "nothing yet" if entry is None else f"{describe(entry[1])} of schedule instruction {entry[0]}"


class ProtocolViolation(Exception):
    """Silent corruption on the GPU: a load or write into the output tile before the store of its previous use has
    read it, a load into a ring stage the producer has not claimed in that lap, a stage read for another operand than
    it holds, or a parity wait that passed on another phase than the one it meant."""
