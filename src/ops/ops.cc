// The op descriptors' table: one struct per op (the forward pass's in src/ops/forward_ops.h, prefill's and decode's
// in decode_ops.h and decode_attention_ops.h), checked against the HostOp concept and gathered into one table in
// opcode order. Op families (row-wise, GEMM: src/ops/op_families.h) share their tiling and cost through a base
// template; each op adds what is its own: buffers, weights, constraints and its CPU tile function.
#include "mk/ops.h"

#include <algorithm>

#include "decode_attention_ops.h"
#include "decode_ops.h"
#include "forward_ops.h"
#include "mk/check.h"

namespace mk {

namespace {

using namespace ops;

// ---- the table ----

constexpr OpDescriptor kOps[] = {
    descriptor<EmbedOp>(), descriptor<AttnNormOp>(), descriptor<QkvOp>(),    descriptor<AttentionOp>(),
    descriptor<OProjOp>(), descriptor<MlpNormOp>(),  descriptor<GateUpOp>(), descriptor<DownOp>(),
    descriptor<FinalNormOp>(), descriptor<LmHeadOp>(),
    // prefill and decode
    descriptor<KvAppendOp>(), descriptor<DecodeQOp>(), descriptor<DecodeKvOp>(), descriptor<DecodeAttentionOp>(),
    descriptor<DecodeCombineOp>(), descriptor<DecodeOProjOp>(), descriptor<DecodeGateUpOp>(), descriptor<DecodeDownOp>(),
    descriptor<DecodeLmHeadOp>(), descriptor<SampleOp>(), descriptor<DecodeOProjCombineOp>(),
};
static_assert(std::size(kOps) == size_t(Opcode::kNumOpcodes) - 1, "every opcode but kNop has exactly one descriptor");
static_assert([] {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (kOps[i].opcode != Opcode(i + 1)) return false;
  return true;
}(), "descriptors in opcode order: op_descriptor indexes the table by opcode");

}  // namespace

const OpDescriptor& op_descriptor(Opcode opcode) {
  const size_t index = size_t(opcode);
  MK_CHECK(index >= 1 && index <= std::size(kOps), "no op has opcode {}", index);
  return kOps[index - 1];
}

std::span<const OpDescriptor> op_descriptors() { return kOps; }

const char* opcode_name(Opcode opcode) {
  if (opcode == Opcode::kNop) return "nop";
  const size_t index = size_t(opcode);
  return index <= std::size(kOps) ? kOps[index - 1].name : "invalid";
}

Task whole_output(const OpDescriptor& op, const OpContext& ctx, uint16_t layer) {
  const Buffer& out = ctx.buffers.buffers()[ctx.buffers.id(op.output(layer))];
  return {op.opcode, layer, 0, int32_t(out.rows), 0, int32_t(out.cols), -1, -1};
}

}  // namespace mk
