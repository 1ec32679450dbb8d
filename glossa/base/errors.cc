#include "glossa/base/errors.h"

namespace glossa {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
  }
  return "UNKNOWN";
}

Error::Error(StatusCode code, const std::string& message)
    : std::runtime_error(std::string(StatusCodeName(code)) + ": " + message),
      code_(code),
      message_(message) {}

void ThrowError(StatusCode code, const std::string& message) {
  switch (code) {
    case StatusCode::kInvalidArgument: throw InvalidArgumentError(message);
    case StatusCode::kNotFound: throw NotFoundError(message);
    case StatusCode::kOutOfRange: throw OutOfRangeError(message);
    case StatusCode::kDataLoss: throw DataLossError(message);
    case StatusCode::kFailedPrecondition: throw FailedPreconditionError(message);
    case StatusCode::kAborted: throw AbortedError(message);
    case StatusCode::kInternal: throw InternalError(message);
    case StatusCode::kUnimplemented: throw UnimplementedError(message);
  }
  throw InternalError("unknown status code: " + message);
}

}  // namespace glossa
