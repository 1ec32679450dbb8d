#include "glossa/base/errors.h"

#include <gtest/gtest.h>

namespace glossa {
namespace {

TEST(Errors, EachTypeCarriesItsCodeAndPrefixesWhat) {
  struct Case {
    StatusCode code;
    const char* name;
  };
  const Case cases[] = {{StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
                        {StatusCode::kNotFound, "NOT_FOUND"},
                        {StatusCode::kOutOfRange, "OUT_OF_RANGE"},
                        {StatusCode::kDataLoss, "DATA_LOSS"},
                        {StatusCode::kFailedPrecondition, "FAILED_PRECONDITION"},
                        {StatusCode::kAborted, "ABORTED"},
                        {StatusCode::kInternal, "INTERNAL"},
                        {StatusCode::kUnimplemented, "UNIMPLEMENTED"}};
  for (const auto& c : cases) {
    try {
      ThrowError(c.code, "file x.txt, line 3: bad");
      FAIL() << "ThrowError returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code);
      EXPECT_EQ(StatusCodeName(e.code()), c.name);
      EXPECT_EQ(e.message(), "file x.txt, line 3: bad");
      EXPECT_EQ(std::string(e.what()), std::string(c.name) + ": file x.txt, line 3: bad");
    }
  }
}

TEST(Errors, ThrowErrorThrowsTheMatchingSubclass) {
  EXPECT_THROW(ThrowError(StatusCode::kNotFound, "m"), NotFoundError);
  EXPECT_THROW(ThrowError(StatusCode::kOutOfRange, "m"), OutOfRangeError);
  EXPECT_THROW(ThrowError(StatusCode::kDataLoss, "m"), DataLossError);
  EXPECT_THROW(ThrowError(StatusCode::kAborted, "m"), AbortedError);
  EXPECT_THROW(ThrowError(StatusCode::kInvalidArgument, "m"), InvalidArgumentError);
  EXPECT_THROW(ThrowError(StatusCode::kFailedPrecondition, "m"), FailedPreconditionError);
  EXPECT_THROW(ThrowError(StatusCode::kInternal, "m"), InternalError);
  EXPECT_THROW(ThrowError(StatusCode::kUnimplemented, "m"), UnimplementedError);
}

TEST(Errors, OutOfRangeIsDistinctFromOtherErrors) {
  // End of data must never be caught as a data error and vice versa.
  bool caught_as_data_loss = false;
  try {
    throw OutOfRangeError("end of data");
  } catch (const DataLossError&) {
    caught_as_data_loss = true;
  } catch (const OutOfRangeError&) {
  }
  EXPECT_FALSE(caught_as_data_loss);
}

}  // namespace
}  // namespace glossa
