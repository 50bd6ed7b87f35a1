// The decode attention chain of a traced step: per layer, from the last q/kv tile's end through attention and its
// combines to the last o_proj tile's end.
#include "trace_chain.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace mk {

TraceSummary::AttentionChain attention_chain_of(const std::map<std::pair<Opcode, uint16_t>, double>& last_end) {
  // NOTE: ends, not publications: decode tiles publish as their consumers finish (no storer), and a linked combine's
  // record ends where the attention task that ran it published the combine's counter.
  const auto end_of = [&](Opcode op, uint16_t layer) {
    const auto at = last_end.find({op, layer});
    return at == last_end.end() ? -1.0 : at->second;
  };
  TraceSummary::AttentionChain chain;
  for (const auto& [key, o_proj] : last_end) {
    if (key.first != Opcode::kDecodeOProj) continue;
    const uint16_t layer = key.second;
    const double qkv = std::max(end_of(Opcode::kDecodeQ, layer), end_of(Opcode::kDecodeKv, layer));
    const double attention = end_of(Opcode::kDecodeAttention, layer);
    if (qkv < 0 || attention < 0) continue;
    const double combine = std::max(attention, end_of(Opcode::kDecodeCombine, layer));  // none: no time
    chain.layers += 1;
    chain.to_attention_ns += attention - qkv;
    chain.to_combine_ns += combine - attention;
    chain.to_o_proj_ns += o_proj - combine;
  }
  if (chain.layers == 0) return chain;
  chain.to_attention_ns /= double(chain.layers);
  chain.to_combine_ns /= double(chain.layers);
  chain.to_o_proj_ns /= double(chain.layers);
  return chain;
}

std::string format_attention_chain(const TraceSummary& s) {
  const TraceSummary::AttentionChain& c = s.attention_chain;
  if (c.layers == 0) return "";
  const double chain_ns = c.to_attention_ns + c.to_combine_ns + c.to_o_proj_ns;
  return fmt::format(
      "attention chain per layer (means over {} layers, us): from the last q/kv tile's end, +{:.2f} to the last\n"
      "  attention tile's end, +{:.2f} to the last combine's, +{:.2f} to the last o_proj tile's (o_proj's weights\n"
      "  stream in this last part): {:.2f} in all; summed over the {} layers, {:.1f}% of the step's span\n",
      c.layers, c.to_attention_ns / 1e3, c.to_combine_ns / 1e3, c.to_o_proj_ns / 1e3, chain_ns / 1e3, c.layers,
      100 * chain_ns * double(c.layers) / s.span_ns);
}

}  // namespace mk
