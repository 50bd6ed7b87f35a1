// libFuzzer entry point for schedule files: any bytes must load into a structurally consistent schedule or throw
// mk::Error, and a loaded schedule of a small graph must be proved safe or refused by the verifier, never crash it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "mk/check.h"
#include "mk/graph.h"
#include "mk/schedule.h"

namespace {

// The input as a file: load_schedule reads paths. An in-memory file keeps the disk out of every execution.
std::string as_file(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz-schedule", 0);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != ssize_t(size)) std::abort();
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mk::LoadedSchedule loaded = mk::load_schedule(as_file(data, size));
    const mk::Schedule& s = loaded.schedule;
    // What load_schedule promises before anything is verified.
    if (s.num_sms < 1 || s.num_sms > 4096 || s.sm_begin.size() != size_t(s.num_sms) + 1 ||
        s.num_counters > s.instructions.size())
      std::abort();
    // Small graphs only: the fuzzer's time goes into the verifier, not into tiling huge shapes.
    if (mk::count_tasks(loaded.config, loaded.shape) > 4096) return 0;
    const mk::Graph graph(loaded.config, loaded.shape);
    mk::verify_schedule(graph, s);
  } catch (const mk::Error&) {
  }
  return 0;
}
