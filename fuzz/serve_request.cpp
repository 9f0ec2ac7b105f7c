// libFuzzer target: the server's JSON-to-request mapping (serve/protocol.h: ParseRequest) for
// the three APIs on arbitrary request bodies, and the error body of whatever it refuses. A parsed
// request must be within the documented ranges.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/sampler.h"
#include "serve/protocol.h"

using substrate::serve::Api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Api api : {Api::kOpenAIChat, Api::kOpenAICompletion, Api::kAnthropicMessages}) {
    substrate::serve::GenerationRequest r;
    substrate::serve::ApiError e;
    if (substrate::serve::ParseRequest(api, body, &r, &e)) {
      const auto& s = r.sampling;
      if (!(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p >= 0 && s.top_p <= 1) ||
          s.top_k < 0 || s.top_k > substrate::kMaxTopK || s.max_tokens < 0 || s.logprobs > 20)
        __builtin_trap();
      if (api != Api::kOpenAICompletion && !r.messages.is_array()) __builtin_trap();
    } else {
      if (e.http_status < 400 || e.http_status > 499 || e.message.empty()) __builtin_trap();
      (void)substrate::serve::ErrorBody(api, e);
    }
  }
  return 0;
}
