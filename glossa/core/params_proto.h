// Params <-> Lingvo's Hyperparam proto (same field numbers; bytes interchange with Lingvo), behind
// Params::ToProto, ToProtoBytes, FromProto and FromProtoBytes (glossa/core/params.h), which are
// what callers use.
#pragma once

#include <string>
#include <string_view>

#include "glossa/core/params.h"

namespace glossa {
namespace internal {

void WriteParamsProto(const Params& p, proto::Hyperparam* out);
// Deterministic bytes: equal Params give equal bytes.
std::string ParamsProtoBytes(const Params& p);
// InvalidArgument naming the item for a value Params cannot hold.
Params ParamsFromProto(const proto::Hyperparam& pb);
// DataLoss for bytes that are not a Hyperparam proto.
Params ParamsFromProtoBytes(std::string_view bytes);

}  // namespace internal
}  // namespace glossa
