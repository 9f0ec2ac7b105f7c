// Internal to src/serve: DeepSeek's tool-call markers (fullwidth bars, U+2581 for spaces),
// shared by the tool-call grammars and parsers.
#pragma once

#include <string>

namespace substrate::serve {

inline const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>";
inline const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";
inline const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
inline const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
inline const std::string kDsSep = "<｜tool▁sep｜>";

}  // namespace substrate::serve
