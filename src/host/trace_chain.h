// The decode attention chain of a traced step (TraceSummary::AttentionChain), for trace.cc's summary.
#pragma once

#include "mk/graph.h"
#include "mk/trace.h"

namespace mk {

TraceSummary::AttentionChain summarize_attention_chain(const Graph& graph, const Trace& trace);

}  // namespace mk
