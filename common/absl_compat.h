#pragma once
// Debian 12's abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which does not convert to or from std::string_view: StrCat, SimpleAtoi, StrSplit and friends
// reject a std::string_view argument. These helpers bridge the two without copying.

#include <string_view>

#include "absl/strings/string_view.h"

namespace hlem {

inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view AsStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace hlem
