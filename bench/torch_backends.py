"""The PyTorch backends a user would pick, each timed on the same model and inputs: eager, eager under a CUDA graph,
and torch.compile in its default, reduce-overhead, max-autotune and max-autotune-no-cudagraphs modes."""
import gc
import statistics
import time

import torch

BACKENDS = ("eager", "eager+graph", "inductor", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SLOW_BACKENDS = ("max-autotune", "max-autotune-no-cudagraphs")  # minutes of autotuning per config
COMPILE_MODES = {"inductor": "default", "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune",
                 "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # these replay cudagraph trees
WARMUP_CALLS = 4  # the first call compiles; cudagraph trees need two more before they replay
MAX_DEVIATION = 5e-2  # relative to the change the stack makes to its input; a broken backend is off by ~1
ERROR_CHARS = 2000


class BenchError(Exception):
    """One measurement that failed; recorded, and the run goes on."""


def time_calls(run, count, iterations):
    """Median ms of single calls, cycling over `count` inputs."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    torch.cuda.synchronize()
    for i in range(iterations):
        starts[i].record()
        run(i % count)
        ends[i].record()
        # Each call starts on an idle GPU, so launch overhead counts, as it does for one mk launch.
        ends[i].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends))


def graph_runner(model, inputs):
    """Eager model replayed from CUDA graphs, one per input: copying inputs into one graph would add to the time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture needs warmed-up kernels and library handles, made off the default stream
        for x in inputs:
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outputs = [], []
    for x in inputs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(model(x))
        graphs.append(graph)

    def run(i):
        graphs[i].replay()
        return outputs[i]

    return run


def make_runner(backend, model, inputs):
    if backend == "eager":
        return lambda i: model(inputs[i])
    if backend == "eager+graph":
        return graph_runner(model, inputs)
    # Every config is a new model: without a reset, dynamo's recompile limit would silently fall back to eager.
    torch._dynamo.reset()
    compiled = torch.compile(model, mode=COMPILE_MODES[backend])
    if backend not in CUDAGRAPH_MODES:
        return lambda i: compiled(inputs[i])

    def run(i):
        torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous replay are never read again
        return compiled(inputs[i])

    return run


def deviation(output, reference, x):
    """Distance from eager, relative to how far the stack moves its input (the input itself would hide errors)."""
    change = (reference.float() - x.float()).norm()
    return ((output.float() - reference.float()).norm() / change).item()


def bench_backend(backend, model, inputs, reference, iterations, flops):
    start = time.perf_counter()
    with torch.no_grad():
        run = make_runner(backend, model, inputs)
        for i in range(WARMUP_CALLS):
            run(i % len(inputs))
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - start
        off = deviation(run(0), reference, inputs[0])
        if not off <= MAX_DEVIATION:  # written so that NaN fails too
            raise BenchError(f"output deviates from eager by {off:.3g} (allowed {MAX_DEVIATION})")
        ms = time_calls(run, len(inputs), iterations)
    return {"ms": ms, "tflops": flops / ms / 1e9, "setup_s": setup_s, "deviation_from_eager": off}


def release():
    torch._dynamo.reset()  # also drops compiled graphs and cudagraph pools that hold GPU memory
    gc.collect()
    torch.cuda.empty_cache()


def bench_torch(model, inputs, reference, backends, iterations, flops):
    """Every backend on the same model and inputs; a failure of one is recorded and the others go on."""
    results = {}
    for backend in backends:
        try:
            results[backend] = bench_backend(backend, model, inputs, reference, iterations, flops)
            result = results[backend]
            print(f"   {backend:<26} {result['ms']:9.3f} ms {result['tflops']:7.1f} TFLOP/s   "
                  f"(setup {result['setup_s']:.1f} s, deviation from eager {result['deviation_from_eager']:.1e})",
                  flush=True)
        except Exception as error:  # a compile error or OOM in one backend must not lose the others
            results[backend] = {"error": f"{type(error).__name__}: {error}"[:ERROR_CHARS]}
            print(f"   {backend:<26} FAILED: {results[backend]['error'][:300]}", flush=True)
        release()
    return results
