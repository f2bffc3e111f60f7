// PowerSGDOptions: PyTorch's defaults, validation, and the "rank=2,start_iter=10" parser the
// c10d backend uses for GOSSIPCC_ALLREDUCE=powersgd:<options>.
#include "compression/power_sgd_options.h"

#include "comm/core/errors.h"
#include "compression/power_sgd.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace compression {
namespace {

std::string ErrorOf(const std::string& text) {
  try {
    ParsePowerSGDOptions(text);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(PowerSGDOptionsTest, DefaultsArePyTorchs) {
  const PowerSGDOptions o;
  EXPECT_EQ(o.matrix_approximation_rank, 1);
  EXPECT_EQ(o.start_powerSGD_iter, 1000);
  EXPECT_EQ(o.min_compression_rate, 2);
  EXPECT_TRUE(o.use_error_feedback);
  EXPECT_TRUE(o.warm_start);
  EXPECT_EQ(o.orthogonalization_epsilon, 0);
  EXPECT_EQ(o.random_seed, 0u);
  EXPECT_FALSE(o.batch_tensors_with_same_shape);
  EXPECT_EQ(o.num_iters_per_step, 1);
  EXPECT_EQ(o.nonfinite, NonFinitePolicy::kPassThrough);
  EXPECT_NO_THROW(o.Validate());
  EXPECT_EQ(ParsePowerSGDOptions("").ToString(), o.ToString());
}

TEST(PowerSGDOptionsTest, ParsesEveryKey) {
  const PowerSGDOptions o = ParsePowerSGDOptions(
      "rank=2,start_iter=10,min_compression_rate=3.5,error_feedback=0,warm_start=false,seed=42,iterations=3,"
      "batch_same_shape=0,epsilon=1e-8,nonfinite=error");
  EXPECT_EQ(o.matrix_approximation_rank, 2);
  EXPECT_EQ(o.start_powerSGD_iter, 10);
  EXPECT_EQ(o.min_compression_rate, 3.5);
  EXPECT_FALSE(o.use_error_feedback);
  EXPECT_FALSE(o.warm_start);
  EXPECT_EQ(o.random_seed, 42u);
  EXPECT_EQ(o.num_iters_per_step, 3);
  EXPECT_FALSE(o.batch_tensors_with_same_shape);
  EXPECT_EQ(o.orthogonalization_epsilon, 1e-8);
  EXPECT_EQ(o.nonfinite, NonFinitePolicy::kError);
  // ToString parses back to the same options.
  EXPECT_EQ(ParsePowerSGDOptions(o.ToString()).ToString(), o.ToString());
}

TEST(PowerSGDOptionsTest, AcceptsPyTorchNamesAndSpaces) {
  const PowerSGDOptions o = ParsePowerSGDOptions(
      " matrix_approximation_rank = 4 , start_powerSGD_iter=2,use_error_feedback=true,random_seed=7,"
      "num_iters_per_step=2,batch_tensors_with_same_shape=0,orthogonalization_epsilon=0,nonfinite=unchecked");
  EXPECT_EQ(o.matrix_approximation_rank, 4);
  EXPECT_EQ(o.start_powerSGD_iter, 2);
  EXPECT_TRUE(o.use_error_feedback);
  EXPECT_EQ(o.random_seed, 7u);
  EXPECT_EQ(o.num_iters_per_step, 2);
  EXPECT_EQ(o.nonfinite, NonFinitePolicy::kUnchecked);
  // The example from the c10d backend's variable, and the full example string.
  EXPECT_EQ(ParsePowerSGDOptions("rank=2,start_iter=10").matrix_approximation_rank, 2);
  const PowerSGDOptions full = ParsePowerSGDOptions(
      "rank=2,start_iter=10,min_compression_rate=2,error_feedback=1,warm_start=1,seed=0,iterations=1,batch_same_shape=0");
  EXPECT_EQ(full.start_powerSGD_iter, 10);
}

TEST(PowerSGDOptionsTest, KeysAndWordsMatchInAnyCase) {
  const PowerSGDOptions o = ParsePowerSGDOptions("Rank=3,START_powerSGD_ITER=7,Warm_Start=FALSE,NonFinite=Error");
  EXPECT_EQ(o.matrix_approximation_rank, 3);
  EXPECT_EQ(o.start_powerSGD_iter, 7);
  EXPECT_FALSE(o.warm_start);
  EXPECT_EQ(o.nonfinite, NonFinitePolicy::kError);
  EXPECT_EQ(o.ToString(), ParsePowerSGDOptions("rank=3,start_iter=7,warm_start=0,nonfinite=error").ToString());
  // One key in two spellings is still one key given twice; an unknown key is named as written.
  EXPECT_NE(ErrorOf("rank=2,RANK=3").find("key \"rank\" given twice"), std::string::npos) << ErrorOf("rank=2,RANK=3");
  EXPECT_NE(ErrorOf("Rnak=2").find("unknown key \"Rnak\"; valid keys: rank"), std::string::npos) << ErrorOf("Rnak=2");
}

TEST(PowerSGDOptionsTest, RejectsBadStringsListingTheValidKeys) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rank=0", "rank must be in [1, 1048576]"},
      {"rank=-3", "rank must be in [1, 1048576]"},
      {"rank=two", "rank=two is not an integer"},
      {"rnak=2", "unknown key \"rnak\""},
      {"rank=2,rank=3", "given twice"},
      {"rank=2,matrix_approximation_rank=3", "given twice"},
      {"rank", "\"rank\" is not key=value"},
      {"rank=", "has no value"},
      {"error_feedback=yes", "is not a boolean"},
      {"min_compression_rate=-1", "min_compression_rate must be a finite number >= 0"},
      {"min_compression_rate=nan", "not a finite number"},
      {"epsilon=-1", "orthogonalization_epsilon (epsilon) must be"},
      {"start_iter=-5", "start_powerSGD_iter (start_iter) must be >= 0"},
      {"iterations=0", "iterations must be in [1, 1000]"},
      {"seed=-1", "not an unsigned integer"},
      {"nonfinite=ignore", "is not one of pass, error, unchecked"},
  };
  for (const auto& [text, why] : cases) {
    const std::string e = ErrorOf(text);
    EXPECT_NE(e.find(why), std::string::npos) << text << " -> " << e;
    EXPECT_NE(e.find("valid keys: rank (or matrix_approximation_rank)"), std::string::npos) << e;
    EXPECT_NE(e.find("iterations (or num_iters_per_step)"), std::string::npos) << e;
  }
}

// batch_same_shape=1 (PyTorch's batch_tensors_with_same_shape=True) is refused, saying why:
// it would not reduce collectives, since one call already sends every matrix's P in one
// all-reduce and every Q in another (counted in power_sgd_test's
// PowerSGDCollectivesTest). 0, PyTorch's default, stays accepted under both names.
TEST(PowerSGDOptionsTest, RejectsBatchSameShapeSayingWhy) {
  for (const char* text : {"batch_same_shape=1", "batch_same_shape=true", "rank=2, batch_tensors_with_same_shape = True"}) {
    const std::string e = ErrorOf(text);
    EXPECT_EQ(e.find("invalid PowerSGD options"), 0u) << text << " -> " << e;
    EXPECT_NE(e.find("batch_tensors_with_same_shape (batch_same_shape) = 1 is rejected: it would not cut collectives"),
              std::string::npos)
        << text << " -> " << e;
    EXPECT_NE(e.find("already all-reduces the P factors of all its matrices in one all-reduce and their Q factors in "
                     "another, whatever their shapes"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("Leave it 0"), std::string::npos) << e;
    EXPECT_EQ(e.find("unknown key"), std::string::npos) << e;
    EXPECT_NE(e.find("batch_same_shape (or batch_tensors_with_same_shape) [0; 1 is rejected]"), std::string::npos) << e;
  }
  EXPECT_NE(ErrorOf("batch_same_shape=maybe").find("is not a boolean"), std::string::npos);
  for (const char* text : {"batch_same_shape=0", "batch_same_shape=false", "batch_tensors_with_same_shape=0"}) {
    EXPECT_EQ(ErrorOf(text), "") << text;
    EXPECT_FALSE(ParsePowerSGDOptions(text).batch_tensors_with_same_shape) << text;
  }
  EXPECT_NE(PowerSGDOptions().ToString().find(",batch_same_shape=0,"), std::string::npos);
  // Set in the struct: Validate() and the constructor refuse it with the same reason.
  PowerSGDOptions o;
  o.batch_tensors_with_same_shape = true;
  try {
    PowerSGD p(o);
    ADD_FAILURE() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(kBatchSameShapeRejected), std::string::npos) << e.what();
  }
  EXPECT_THROW(o.Validate(), InvalidArgumentError);
}

TEST(PowerSGDOptionsTest, ValidateAndTheConstructorRejectOutOfRangeValues) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 0;
  EXPECT_THROW(o.Validate(), InvalidArgumentError);
  try {
    PowerSGD p(o);
    ADD_FAILURE() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("matrix_approximation_rank (rank) must be >= 1, got 0"), std::string::npos)
        << e.what();
  }
  o = PowerSGDOptions();
  o.num_iters_per_step = 0;
  EXPECT_THROW(PowerSGD{o}, InvalidArgumentError);
  o = PowerSGDOptions();
  o.orthogonalization_epsilon = -1;
  EXPECT_THROW(PowerSGD{o}, InvalidArgumentError);
  o = PowerSGDOptions();
  o.start_powerSGD_iter = -1;
  EXPECT_THROW(PowerSGD{o}, InvalidArgumentError);
}

// Found by tools/fuzz.sh: ToString() printed doubles with 6 significant digits, so options
// such as min_compression_rate=1.2345678901234567 came back different from a checkpoint (which
// stores ToString()) and then hashed differently in the cross-rank check.
TEST(PowerSGDOptionsTest, ToStringKeepsEveryDigitOfTheDoubles) {
  for (const char* text : {"min_compression_rate=1.2345678901234567,epsilon=0.1",
                           "min_compression_rate=0.30000000000000004,epsilon=1.0000000000000002e-300",
                           "min_compression_rate=1e300,epsilon=4.9406564584124654e-324"}) {
    const PowerSGDOptions o = ParsePowerSGDOptions(text);
    const PowerSGDOptions back = ParsePowerSGDOptions(o.ToString());
    EXPECT_EQ(back.min_compression_rate, o.min_compression_rate) << text << " -> " << o.ToString();
    EXPECT_EQ(back.orthogonalization_epsilon, o.orthogonalization_epsilon) << text << " -> " << o.ToString();
    EXPECT_EQ(back.ToString(), o.ToString());
  }
  // Values that 6 digits already represent print as before.
  const std::string s = ParsePowerSGDOptions("min_compression_rate=3.5,epsilon=1e-8").ToString();
  EXPECT_NE(s.find(",min_compression_rate=3.5,"), std::string::npos) << s;
  EXPECT_NE(s.find(",epsilon=1e-08,"), std::string::npos) << s;
  EXPECT_NE(PowerSGDOptions().ToString().find(",min_compression_rate=2,"), std::string::npos);
}

}  // namespace
}  // namespace compression
}  // namespace gossipcc
