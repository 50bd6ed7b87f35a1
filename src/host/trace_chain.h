// The decode attention chain of a traced step (TraceSummary::AttentionChain), for trace.cc's summary.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "mk/trace.h"

namespace mk {

// From each (op, layer)'s last tile end, ns (trace.cc's per-layer phases).
TraceSummary::AttentionChain attention_chain_of(const std::map<std::pair<Opcode, uint16_t>, double>& last_end);
// The summary's line for it; empty where there is none (a forward pass).
std::string format_attention_chain(const TraceSummary& summary);

}  // namespace mk
