// Tests of the tolerance policy itself: it passes what a correct bf16 engine produces and rejects a planted wrong op.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "mk/compare.h"
#include "mk/reference.h"

namespace mk {
namespace {

class Tolerance : public ::testing::Test {
 protected:
  const ModelConfig config_ = find_preset("tiny").config;
  const RunShape shape_ = find_preset("tiny").shape;
  const ModelWeights weights_ = random_weights(config_, 11);
  const ref::ModelInput input_ = ref::random_input(config_, shape_, 12);
};

TEST_F(Tolerance, PassesTheBf16ComputationOfTheSameModel) {
  const ref::Matrix bf16 = ref::forward(weights_, input_, {.round_activations_to_bf16 = true});
  const TolerancePolicy policy = check_tolerance(bf16, weights_, input_);
  EXPECT_TRUE(policy.passed) << policy.describe();
}

// An indexing bug of the kind a kernel makes: o_proj of layer 0 reads two heads' outputs swapped.
TEST_F(Tolerance, RejectsAnOutputWithOneWrongOp) {
  ModelWeights wrong = weights_;
  std::vector<bf16>& wo = wrong.layers[0].wo;  // (d_model, n_heads * head_dim)
  const int64_t q_dim = config_.q_dim(), head_dim = config_.head_dim;
  for (int64_t row = 0; row < config_.d_model; ++row)
    for (int64_t d = 0; d < head_dim; ++d) std::swap(wo[size_t(row * q_dim + d)], wo[size_t(row * q_dim + head_dim + d)]);
  const ref::Matrix output = ref::forward(wrong, input_, {.round_activations_to_bf16 = true});
  const TolerancePolicy policy = check_tolerance(output, weights_, input_);
  EXPECT_FALSE(policy.passed) << policy.describe();
  EXPECT_GT(policy.engine.rel_l2_error, 3 * policy.allowed) << "rejected by a wide margin, not by noise";
}

TEST_F(Tolerance, RejectsASingleNan) {
  ref::Matrix output = ref::forward(weights_, input_, {.round_activations_to_bf16 = true});
  output.data[output.data.size() / 2] = NAN;
  const TolerancePolicy policy = check_tolerance(output, weights_, input_);
  EXPECT_FALSE(policy.passed) << policy.describe();
  EXPECT_EQ(policy.engine.nan_count, 1u);
}

}  // namespace
}  // namespace mk
