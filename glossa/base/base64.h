// Base64 (RFC 4648, standard alphabet): how JSON clients send binary feeds (WAV files, images)
// to `glossa predict` and `glossa serve`.
//
//   std::optional<std::string> bytes = Base64Decode(text);   // nullopt: not base64
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace glossa {

std::string Base64Encode(std::string_view bytes);
// Whitespace is skipped and '=' padding ends the data; nullopt for any other character outside
// the alphabet, or for no data at all.
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace glossa
