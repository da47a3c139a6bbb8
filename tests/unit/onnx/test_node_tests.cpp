// ONNX backend node tests through the importer and the CPU backend: a selection
// covering every op importer (the full sweep is the conformance runner's job), and a
// robustness sweep: every node-test model either imports or throws fusebox::Error.
#include <filesystem>

#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

struct NodeTest {
  const char* name;
  bool freeze_params = false;  // inputs after the first (shapes, pads, axes) frozen to the data
};

class OnnxNodeTest : public ::testing::TestWithParam<NodeTest> {};

TEST_P(OnnxNodeTest, MatchesReferenceOutputs) {
  if (!onnx_node_tests_available()) GTEST_SKIP() << "ONNX node test data not installed";
  EXPECT_TRUE(run_onnx_node_test(GetParam().name, GetParam().freeze_params));
}

const NodeTest kNodeTests[] = {
    // conv family
    {"test_basic_conv_with_padding"},
    {"test_conv_with_autopad_same"},
    {"test_conv_with_strides_and_asymmetric_padding"},
    {"test_convtranspose"},
    {"test_convtranspose_1d"},
    {"test_convtranspose_3d"},
    {"test_convtranspose_autopad_same"},
    {"test_convtranspose_dilations"},
    {"test_convtranspose_kernel_shape"},
    {"test_convtranspose_output_shape"},
    {"test_convtranspose_pad"},
    {"test_convtranspose_pads"},
    // pools
    {"test_maxpool_1d_default"},
    {"test_maxpool_2d_same_lower"},
    {"test_maxpool_2d_same_upper"},
    {"test_maxpool_2d_ceil"},
    {"test_maxpool_2d_dilations"},
    {"test_maxpool_3d_default"},
    {"test_maxpool_with_argmax_2d_precomputed_pads"},
    {"test_averagepool_1d_default"},
    {"test_averagepool_2d_same_upper"},
    {"test_averagepool_2d_same_lower"},
    {"test_averagepool_2d_pads_count_include_pad"},
    {"test_averagepool_2d_ceil"},
    {"test_averagepool_3d_default"},
    // normalisation, losses, dropout
    {"test_batchnorm_example"},
    {"test_batchnorm_epsilon_training_mode"},
    {"test_layer_normalization_4d_axis1"},
    {"test_layer_normalization_4d_axis1_expanded"},
    {"test_layer_normalization_2d_axis0_expanded"},
    {"test_layer_normalization_3d_axis_negative_2_epsilon_expanded"},
    {"test_layer_normalization_default_axis"},
    {"test_sce_mean_weight_ii_3d_log_prob"},
    {"test_sce_none_weights"},
    {"test_sce_NCd1d2d3_sum_weight_high_ii"},
    {"test_dropout_default_mask"},
    {"test_dropout_default_old"},
    // pointwise
    {"test_relu"},
    {"test_sigmoid"},
    {"test_tanh"},
    {"test_exp"},
    {"test_log"},
    {"test_sqrt"},
    {"test_reciprocal"},
    {"test_neg"},
    {"test_abs"},
    {"test_erf"},
    {"test_identity"},
    {"test_leakyrelu"},
    {"test_leakyrelu_default"},
    {"test_clip", true},
    {"test_clip_default_min", true},
    {"test_add_bcast"},
    {"test_sub"},
    {"test_mul"},
    {"test_div"},
    {"test_pow_types_float32_int64"},
    {"test_max_example"},
    {"test_min_one_input"},
    {"test_max_int64"},
    {"test_sum_example"},
    {"test_mean_example"},
    // matmul
    {"test_matmul_4d"},
    {"test_gemm_all_attributes"},
    {"test_gemm_default_no_bias"},
    {"test_gemm_default_scalar_bias"},
    // reductions
    {"test_reduce_sum_keepdims_random", true},
    {"test_reduce_sum_empty_axes_input_noop_example", true},
    {"test_reduce_sum_default_axes_keepdims_random", true},
    {"test_reduce_mean_do_not_keepdims_random"},
    {"test_reduce_max_negative_axes_keepdims_random"},
    {"test_reduce_min_keepdims_random"},
    {"test_reduce_l1_do_not_keepdims_random"},
    {"test_reduce_l2_negative_axes_keep_dims_random"},
    {"test_reduce_log_sum_default"},
    {"test_reduce_log_sum_exp_do_not_keepdims_random"},
    {"test_reduce_sum_square_keepdims_random"},
    // softmax
    {"test_softmax_axis_0"},
    {"test_softmax_axis_0_expanded"},
    {"test_softmax_large_number"},
    {"test_logsoftmax_axis_1"},
    {"test_logsoftmax_axis_1_expanded"},
    // shape ops
    {"test_reshape_negative_dim", true},
    {"test_reshape_allowzero_reordered", true},
    {"test_reshape_zero_and_negative_dim", true},
    {"test_flatten_negative_axis2"},
    {"test_flatten_axis0"},
    {"test_transpose_all_permutations_3"},
    {"test_transpose_default"},
    {"test_concat_3d_axis_negative_2"},
    {"test_slice", true},
    {"test_slice_neg_steps", true},
    {"test_slice_default_axes", true},
    {"test_slice_end_out_of_bounds", true},
    {"test_constant_pad", true},
    {"test_reflect_pad", true},
    {"test_edge_pad", true},
    {"test_squeeze_negative_axes", true},
    {"test_unsqueeze_unsorted_axes", true},
    {"test_unsqueeze_two_axes", true},
    {"test_cast_FLOAT_to_FLOAT16"},
    {"test_cast_FLOAT16_to_DOUBLE"},
    {"test_constant"},
    {"test_shape"},
    {"test_shape_start_1_end_negative_1"},
    {"test_shape_clip_start"},
    {"test_size"},
};

INSTANTIATE_TEST_SUITE_P(Selected, OnnxNodeTest, ::testing::ValuesIn(kNodeTests),
                         [](const ::testing::TestParamInfo<NodeTest>& info) {
                           return std::string(info.param.name);
                         });

// Every model of the node-test data either imports or throws fusebox::Error: no
// crash and no other exception, whatever op, opset or dtype it uses.
TEST(OnnxNodeTestSweep, EveryModelImportsOrThrowsError) {
  if (!onnx_node_tests_available()) GTEST_SKIP() << "ONNX node test data not installed";
  namespace fs = std::filesystem;
  int imported = 0, refused = 0, unsupported = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(onnx_node_test_dir("")))) {
    const std::string model = entry.path().string() + "/model.onnx";
    if (!fs::exists(model)) continue;
    try {
      import_onnx_file(model);
      ++imported;
    } catch (const Error& e) {
      ++refused;
      if (onnx_error_is_unsupported(e)) ++unsupported;
      EXPECT_EQ(e.where(), "onnx import: " + model);
    } catch (const std::exception& e) {
      ADD_FAILURE() << model << ": threw a non-fusebox exception: " << e.what();
    }
  }
  // Most node tests feed shapes as graph inputs; a fair share still imports as is.
  EXPECT_GT(imported, 250);
  EXPECT_GT(refused, 0);
  std::printf("node-test models: %d imported, %d refused (%d as unsupported)\n", imported, refused,
              unsupported);
}

}  // namespace
}  // namespace fusebox::testing
