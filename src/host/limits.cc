// Host memory limits, sizes in messages, and escaping of file-derived text.
#include "mk/limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace mk {

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && page_size > 0 ? uint64_t(pages) * uint64_t(page_size) : UINT64_MAX;
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    bytes = std::min<uint64_t>(bytes, limit.rlim_cur);
  // cgroup v2: "max" or a byte count.
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  uint64_t cgroup_bytes = 0;
  if (cgroup >> cgroup_bytes && cgroup_bytes > 0) bytes = std::min(bytes, cgroup_bytes);
  return bytes;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  return fmt::format("{:.2f} {}", bytes, units[unit]);
}

void check_memory(double bytes, double available, std::string_view what, std::string_view where) {
  MK_CHECK(bytes <= available, "{} needs {} of {}, more than the {} there is", what, human_bytes(bytes), where,
           human_bytes(available));
}

namespace {

// Length of the UTF-8 sequence at text[i] and its code point, or 0 when the bytes there are not UTF-8.
size_t utf8_sequence(std::string_view text, size_t i, uint32_t& code_point) {
  const auto byte = [&](size_t k) { return uint8_t(text[k]); };
  const uint8_t lead = byte(i);
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  if (lead >= 0xE0 && lead <= 0xEF) length = 3;
  if (lead >= 0xF0 && lead <= 0xF4) length = 4;
  if (length == 0 || i + length > text.size()) return 0;
  code_point = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = code_point << 6 | (byte(i + k) & 0x3F);
  }
  const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < least[length] || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point < 0xE000)) return 0;
  return length;
}

bool steers_terminal(uint32_t code_point) {
  return code_point < 0x20 || (code_point >= 0x7F && code_point < 0xA0) ||  // C0, DEL, C1
         (code_point >= 0x202A && code_point <= 0x202E) ||                  // bidi embeddings and overrides
         (code_point >= 0x2066 && code_point <= 0x2069);                    // bidi isolates
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t code_point = uint8_t(text[i]);
    size_t length = code_point < 0x80 ? 1 : utf8_sequence(text, i, code_point);
    if (length == 0 || steers_terminal(code_point)) {
      for (size_t k = 0; k < std::max<size_t>(length, 1); ++k) out += fmt::format("\\x{:02x}", uint8_t(text[i + k]));
      i += std::max<size_t>(length, 1);
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

}  // namespace mk
