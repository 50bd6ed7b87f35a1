"""Tests of scripts/ncu_stalls.py on a small made-up profile: samples join their source lines by SASS offset (in the
section of the megakernel compilation the profile sampled), helpers are charged to their caller, and a listing of
another build is refused."""
import gzip
import importlib.util
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_stalls.py"
spec = importlib.util.spec_from_file_location("ncu_stalls", SCRIPT)
ncu_stalls = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_stalls)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)", "stall_wait (Not Issued)"]
# (address, SASS, samples, long_sb, wait): three instructions at offsets 0x0, 0x10, 0x20 of a kernel at 0x7f00
PROFILE = [("0x7f00", "      STS [R2], R3", 7, 2, 5),
           ("0x7f10", "@P0   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R4], R5", 30, 30, 0),
           ("0x7f20", "      HGMMA.64x128x16.F32.BF16 R8, gdesc[UR8], R8", 3, 0, 3)]
LISTING = """//--------------------- .text._ZN2mk3gpu10megakernelENS0_16MegakernelParamsE --------------------------
\t//## File "/src/ops/gemm_epilogue.cuh", line 73
        /*0000*/                   STS [R2], R3 ;
\t//## File "/src/device/ptx.cuh", line 47 inlined at "/src/device/sync.cuh", line 130
\t//## File "/src/device/sync.cuh", line 130 inlined at "/src/ops/gemm_sm90.cuh", line 155
\t//## File "/src/ops/gemm_sm90.cuh", line 155
        /*0010*/              @P0  SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R4+URZ], R5 ;
\t//## File "/usr/local/cuda/include/sm_30_intrinsics.hpp", line 110 inlined at "/src/ops/gemm_sm90.cuh", line 166
\t//## File "/src/ops/gemm_sm90.cuh", line 166
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R8, gdesc[UR8], R8 ;
//--------------------- .text._Z6helperv --------------------------
\t//## File "/src/ops/other.cuh", line 9
        /*0010*/                   LDS R3, [R2] ;
"""


def write_fixture(work, listing=LISTING, profile=PROFILE):
    csv_path = pathlib.Path(work) / "source.csv.gz"
    with gzip.open(csv_path, "wt") as f:
        f.write('"Kernel Name","megakernel",\n')
        f.write(",".join(f'"{h}"' for h in HEADER) + "\n")
        for address, sass, samples, long_sb, wait in profile:
            f.write(f'"{address}","{sass}","{samples}","{samples}","{long_sb}","{wait}","0","0"\n')
    lines_path = pathlib.Path(work) / "sass-lines.txt"
    lines_path.write_text(listing)
    return str(csv_path), str(lines_path)


def test_samples_go_to_the_innermost_line_outside_the_helpers():
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work)
        samples = ncu_stalls.read_samples(csv_path)
        chains = ncu_stalls.profiled_kernel(samples, ncu_stalls.read_lines(lines_path), lines_path)
        lines = ncu_stalls.by_line(samples, chains)
    assert [s[0] for s in samples] == [0x0, 0x10, 0x20]
    assert lines["gemm_sm90.cuh:155"] == [30, {"long_sb": 30, "wait": 0}]  # the barrier wait, not ptx.cuh's line
    assert lines["gemm_epilogue.cuh:73"] == [7, {"long_sb": 2, "wait": 5}]
    assert lines["gemm_sm90.cuh:166"][0] == 3
    assert "ptx.cuh:47" not in lines and "sync.cuh:130" not in lines and "sm_30_intrinsics.hpp:110" not in lines
    assert "other.cuh:9" not in lines  # another function's instruction at the same offset


def test_the_sampled_compilation_is_picked_among_the_kernels_of_the_cubin():
    # Another megakernel compilation ahead of the profiled one, with its own code at the same offsets.
    decode = """//--------------------- .text._ZN2mk3gpu17megakernel_decodeENS0_16MegakernelParamsE ----------
\t//## File "/src/ops/decode_gemm.cuh", line 350
        /*0000*/                   LDS R3, [R2] ;
        /*0010*/                   IMAD.MOV R5, RZ, RZ, R4 ;
        /*0020*/                   FFMA R8, R8, R9, R8 ;
"""
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work, decode + LISTING)
        samples = ncu_stalls.read_samples(csv_path)
        kernels = ncu_stalls.read_lines(lines_path)
        lines = ncu_stalls.by_line(samples, ncu_stalls.profiled_kernel(samples, kernels, lines_path))
    assert sorted(kernels) == ["_ZN2mk3gpu10megakernelENS0_16MegakernelParamsE",
                               "_ZN2mk3gpu17megakernel_decodeENS0_16MegakernelParamsE"]
    assert lines["gemm_sm90.cuh:155"][0] == 30 and "decode_gemm.cuh:350" not in lines
    # And the other way round: a profile of the decode kernel, listed first, picks its section, not the last one.
    decode_profile = [("0x7f00", "      LDS R3, [R2]", 5, 5, 0), ("0x7f10", "      IMAD.MOV R5, RZ, RZ, R4", 4, 0, 4),
                      ("0x7f20", "      FFMA R8, R8, R9, R8", 2, 0, 2)]
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work, decode + LISTING, decode_profile)
        samples = ncu_stalls.read_samples(csv_path)
        lines = ncu_stalls.by_line(samples, ncu_stalls.profiled_kernel(samples, ncu_stalls.read_lines(lines_path),
                                                                       lines_path))
    assert lines == {"decode_gemm.cuh:350": [11, {"long_sb": 5, "wait": 6}]}


def test_a_listing_of_another_build_is_refused():
    other = LISTING.replace("                   STS [R2], R3", "                   LDS R3, [R2]").replace(
        "HGMMA.64x128x16", "IMAD.MOV")
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work, other)
        result = subprocess.run([sys.executable, str(SCRIPT), csv_path, lines_path], capture_output=True, text=True)
    assert result.returncode != 0
    assert "another build" in result.stderr


def test_a_range_lists_its_instructions_with_their_lines():
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work)
        result = subprocess.run([sys.executable, str(SCRIPT), csv_path, lines_path, "--range", "10-20"],
                                capture_output=True, text=True, check=True)
    assert "000010     30" in result.stdout and "gemm_sm90.cuh:155" in result.stdout.splitlines()[0]
    assert "2 instructions, 33 samples (82.5% of the kernel's)" in result.stdout


def test_the_totals_by_reason_and_a_ranking_by_one_reason():
    with tempfile.TemporaryDirectory() as work:
        csv_path, lines_path = write_fixture(work)
        plain = subprocess.run([sys.executable, str(SCRIPT), csv_path, lines_path], capture_output=True, text=True,
                               check=True)
        ranked = subprocess.run([sys.executable, str(SCRIPT), csv_path, lines_path, "--stall", "wait"],
                                capture_output=True, text=True, check=True)
        unknown = subprocess.run([sys.executable, str(SCRIPT), csv_path, lines_path, "--stall", "sleep"],
                                 capture_output=True, text=True)
    assert plain.stdout.splitlines()[0] == "by stall reason: long_sb 80.0%, wait 20.0%"
    assert plain.stdout.splitlines()[2].split()[0] == "gemm_sm90.cuh:155"  # most samples
    assert ranked.stdout.splitlines()[2].split()[0] == "gemm_epilogue.cuh:73"  # most wait samples
    assert unknown.returncode != 0 and "no stall reason 'sleep'" in unknown.stderr


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
    print("ncu_stalls tests passed")
