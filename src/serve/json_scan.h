// Finding JSON values inside model output that is still being generated: where a value ends,
// or that it has not ended yet. Used to stream tool-call arguments as they are written.
#pragma once

#include <cstddef>
#include <string_view>

namespace substrate::serve {

enum class JsonScan {
  kComplete,    // a whole value: *end is one past it
  kIncomplete,  // the text ends inside a value that may still become valid
  kInvalid,     // not a JSON value
};

// Scans the JSON value starting at text[pos] (no leading whitespace skipped).
JsonScan ScanJsonValue(std::string_view text, size_t pos, size_t* end);

// Skips spaces, tabs, carriage returns and newlines from pos.
size_t SkipJsonSpace(std::string_view text, size_t pos);

}  // namespace substrate::serve
