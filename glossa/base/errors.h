// Errors as exception types that mirror status codes (DESIGN.md §4).
//
// Every error thrown by Glossa derives from glossa::Error and carries a StatusCode, so callers can
// catch one family (`catch (const glossa::NotFoundError&)`) or everything (`catch (const
// glossa::Error& e) { e.code(); }`). Messages name what was wrong and where: the key, file, line or
// byte offset, and what was expected.
//
//   if (!found) throw NotFoundError(StrCat("param '", key, "' not found"));
//   try { p.Set("x", 1); } catch (const glossa::Error& e) { std::cerr << e.what(); }
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace glossa {

enum class StatusCode {
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kDataLoss,
  kFailedPrecondition,
  kAborted,
  kInternal,
  kUnimplemented,
};

// The canonical name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message);
  StatusCode code() const { return code_; }
  // The message without the "CODE: " prefix that what() carries.
  const std::string& message() const { return message_; }

 private:
  StatusCode code_;
  std::string message_;
};

#define GLOSSA_DEFINE_ERROR(Name, Code)                                             \
  class Name : public Error {                                                       \
   public:                                                                          \
    explicit Name(const std::string& message) : Error(StatusCode::Code, message) {} \
  };

GLOSSA_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument)
GLOSSA_DEFINE_ERROR(NotFoundError, kNotFound)
// End of data (input exhausted) or an index past the end; never used for malformed input.
GLOSSA_DEFINE_ERROR(OutOfRangeError, kOutOfRange)
GLOSSA_DEFINE_ERROR(DataLossError, kDataLoss)
GLOSSA_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition)
GLOSSA_DEFINE_ERROR(AbortedError, kAborted)
GLOSSA_DEFINE_ERROR(InternalError, kInternal)
GLOSSA_DEFINE_ERROR(UnimplementedError, kUnimplemented)

#undef GLOSSA_DEFINE_ERROR

// Throws the exception type that matches `code`.
[[noreturn]] void ThrowError(StatusCode code, const std::string& message);

}  // namespace glossa
