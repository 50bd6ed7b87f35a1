// The decode attention chain of a traced step (TraceSummary::AttentionChain), for trace.cc's summary.
#pragma once

#include <string>

#include "mk/graph.h"
#include "mk/trace.h"

namespace mk {

TraceSummary::AttentionChain summarize_attention_chain(const Graph& graph, const Trace& trace);
// The summary's line for it; empty where there is none (a forward pass).
std::string format_attention_chain(const TraceSummary& summary);

}  // namespace mk
