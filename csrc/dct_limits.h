// Limits shared by the CPU and CUDA DCT kernels, so a chunk valid on one device is valid on both.
// Mirrored by exogym/ops/dct.py (MAX_CHUNK_AREA).
#pragma once
#include <cstdint>

namespace exogym {
// Two float planes of a chunk live in a CUDA block's shared memory (2 x 5632 x 4 = 44 KiB).
constexpr int64_t kMaxChunkArea = 5632;
}  // namespace exogym
