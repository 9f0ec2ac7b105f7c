// The page served at GET /: a chat (streaming, tools and JSON-mode toggles) beside a live view
// of the engine (tokens/s, the memory ledger by account against the cap, resident vs streamed
// ops, expert-cache hits and misses, disk reads and stalls per token), drawn from
// /v1/runtime/events. Plain HTML and JavaScript compiled into the binary: no CDN, no build step.
#pragma once

namespace substrate::serve {

extern const char kWebPage[];

}  // namespace substrate::serve
