// Counts heap allocations in this test binary (alloc_counter.cpp replaces operator new), so a
// test can assert that a token loop allocates nothing once warm.
#pragma once

#include <cstdint>

namespace substrate::testing {

// Allocations made by any thread since the process started.
uint64_t AllocationCount();

}  // namespace substrate::testing
