// CRC32C (Castagnoli), as TFRecord framing uses it, with SSE4.2 hardware instructions when the CPU
// has them and a table-driven fallback otherwise.
//
//   uint32_t crc = Crc32c(data, size);
//   uint32_t masked = MaskCrc(crc);   // TFRecord stores masked CRCs
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace glossa {

// Extends `crc` (of earlier bytes) with `data`. Crc32c(d, n) == Crc32cExtend(0, d, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }
inline uint32_t Crc32c(std::string_view s) { return Crc32c(s.data(), s.size()); }

// TensorFlow's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
inline uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// Whether the hardware path is in use.
bool Crc32cIsHardwareAccelerated();

// The CRC32C of 8 bytes (a TFRecord's length field): one instruction where the CPU has it (this
// runs once per record, and a call into the general routine cost as much as the checksum).
uint32_t Crc32cOf8Bytes(const char* p);
// The table-driven implementation (tests compare both paths).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

}  // namespace glossa
