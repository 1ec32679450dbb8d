#include "glossa/base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#include <wmmintrin.h>
#endif

namespace glossa {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

#if defined(__x86_64__)
// x^m mod P in the reflected representation (bit i holds the coefficient of x^(31-i)).
uint32_t XPowMod(uint64_t m) {
  uint32_t r = 0x80000000u;  // x^0
  for (uint64_t i = 0; i < m; ++i) r = (r >> 1) ^ (kPoly & (0u - (r & 1u)));
  return r;
}

// Multiplies the register by x^(8n) for inputs of up to kMaxShiftBytes bytes:
// c·x^(8n) = crc32_u64(0, clmul(c, x^(8n−33) mod P)), because clmul's product of two reflected
// 32-bit values is the 64-bit reflected product times x, and crc32_u64 of one 64-bit word from a
// zero register multiplies it by x^32.
constexpr size_t kMaxShiftBytes = 4096;
struct ShiftTable {
  uint64_t by_bytes[kMaxShiftBytes + 1];  // x^(8n − 33) for n ≥ 5
  ShiftTable() {
    uint32_t r = XPowMod(8 * 5 - 33);
    for (size_t n = 0; n <= kMaxShiftBytes; ++n) {
      if (n < 5) {
        by_bytes[n] = 0;
        continue;
      }
      by_bytes[n] = r;
      for (int i = 0; i < 8; ++i) r = (r >> 1) ^ (kPoly & (0u - (r & 1u)));
    }
  }
};
const ShiftTable& GetShiftTable() {
  static const ShiftTable table;
  return table;
}

__attribute__((target("sse4.2,pclmul"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                                  size_t n) {
  if (n >= 8 && n <= kMaxShiftBytes) {
    // Records are short and of every length, so the cost was the byte-at-a-time tail and its
    // mispredicted loop. The register after bytes B from state c is c·x^(8|B|) + crc(0, B), and
    // from a zero register leading zero bytes change nothing: the first n mod 8 bytes go in as
    // one word whose low bytes are zeros, the rest as whole words, and the incoming state is
    // shifted by a carry-less multiply off the dependency chain.
    const unsigned r = n & 7;
    uint64_t v;
    std::memcpy(&v, p, 8);
    uint64_t c = _mm_crc32_u64(0, (v << 1) << (63 - 8 * r));  // the first r bytes, high in a word
    p += r;
    for (size_t m = n >> 3; m > 0; --m) {
      std::memcpy(&v, p, 8);
      c = _mm_crc32_u64(c, v);
      p += 8;
    }
    const __m128i product = _mm_clmulepi64_si128(
        _mm_cvtsi64_si128(static_cast<int64_t>(static_cast<uint32_t>(~crc))),
        _mm_cvtsi64_si128(static_cast<int64_t>(GetShiftTable().by_bytes[n])), 0);
    const uint64_t shifted = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(product)));
    return ~static_cast<uint32_t>(c ^ shifted);
  }
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return ~c32;
}

bool HasCrcInstructions() {
  static const bool has = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const auto& t = GetTables().t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --size;
  }
  return ~c;
}

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  return HasCrcInstructions();
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (HasCrcInstructions()) return ExtendHardware(crc, static_cast<const uint8_t*>(data), size);
#endif
  return Crc32cExtendPortable(crc, data, size);
}

namespace {
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc8Hardware(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return ~static_cast<uint32_t>(_mm_crc32_u64(0xffffffffu, v));
}
#endif
}  // namespace

uint32_t Crc32cOf8Bytes(const char* p) {
#if defined(__x86_64__)
  static const bool hardware = Crc32cIsHardwareAccelerated();
  if (hardware) return Crc8Hardware(p);
#endif
  return Crc32c(p, 8);
}

}  // namespace glossa
