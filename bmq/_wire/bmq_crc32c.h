/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), docs/protocol.md §2.5.
 *
 * Two engines behind one entry point, chosen once at start-up:
 *  - SSE4.2 `crc32` instruction, run on three independent streams at once because the
 *    instruction has a latency of 3 cycles but a throughput of 1; the three partial CRCs are
 *    merged with precomputed "append N zero bytes" operators (CRC is linear over GF(2)).
 *  - portable slicing-by-8 tables for other CPUs.
 * All state lives in tables filled by bmq_crc32c_init(), which must run once before use
 * (module import does it, under the GIL).  The register convention follows the usual API:
 * bmq_crc32c(0, data, n) is the CRC of data; passing a previous result continues it.
 */
#ifndef BMQ_CRC32C_H
#define BMQ_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define BMQ_CRC32C_POLY 0x82F63B78u
/* Stream lengths of the interleaved hardware loop: the long one amortises the merge on big
 * buffers, the short one still helps messages of a few hundred bytes. */
#define BMQ_CRC32C_LONG 8192
#define BMQ_CRC32C_SHORT 256

static uint32_t bmq_crc32c_table[8][256];
static uint32_t bmq_crc32c_long_shift[4][256];
static uint32_t bmq_crc32c_short_shift[4][256];
static int bmq_crc32c_have_hw = 0;

/* Register after feeding `nbytes` zero bytes, starting from `reg` (no pre/post inversion). */
static uint32_t bmq_crc32c_zeros_slow(uint32_t reg, size_t nbytes) {
    while (nbytes--)
        reg = bmq_crc32c_table[0][reg & 0xFF] ^ (reg >> 8);
    return reg;
}

static void bmq_crc32c_fill_shift(uint32_t table[4][256], size_t nbytes) {
    uint32_t basis[32];
    int bit, k, i;
    for (bit = 0; bit < 32; bit++)
        basis[bit] = bmq_crc32c_zeros_slow((uint32_t)1 << bit, nbytes);
    for (k = 0; k < 4; k++) {
        for (i = 0; i < 256; i++) {
            uint32_t v = 0;
            for (bit = 0; bit < 8; bit++)
                if (i & (1 << bit))
                    v ^= basis[8 * k + bit];
            table[k][i] = v;
        }
    }
}

static inline uint32_t bmq_crc32c_shift(uint32_t table[4][256], uint32_t reg) {
    return table[0][reg & 0xFF] ^ table[1][(reg >> 8) & 0xFF] ^
           table[2][(reg >> 16) & 0xFF] ^ table[3][reg >> 24];
}

static uint32_t bmq_crc32c_sw(uint32_t reg, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        reg = bmq_crc32c_table[0][(reg ^ *p++) & 0xFF] ^ (reg >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= reg;
        reg = bmq_crc32c_table[7][lo & 0xFF] ^ bmq_crc32c_table[6][(lo >> 8) & 0xFF] ^
              bmq_crc32c_table[5][(lo >> 16) & 0xFF] ^ bmq_crc32c_table[4][lo >> 24] ^
              bmq_crc32c_table[3][hi & 0xFF] ^ bmq_crc32c_table[2][(hi >> 8) & 0xFF] ^
              bmq_crc32c_table[1][(hi >> 16) & 0xFF] ^ bmq_crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        reg = bmq_crc32c_table[0][(reg ^ *p++) & 0xFF] ^ (reg >> 8);
    return reg;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <nmmintrin.h>
#define BMQ_CRC32C_HW_POSSIBLE 1

static inline uint64_t bmq_load_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Three streams of `len` bytes each, merged into one register. */
#define BMQ_CRC32C_3WAY(len, shift_table)                                          \
    while (n >= 3 * (size_t)(len)) {                                               \
        uint64_t c1 = 0, c2 = 0;                                                   \
        const unsigned char *end = p + (len);                                      \
        do {                                                                       \
            c0 = _mm_crc32_u64(c0, bmq_load_u64(p));                               \
            c1 = _mm_crc32_u64(c1, bmq_load_u64(p + (len)));                       \
            c2 = _mm_crc32_u64(c2, bmq_load_u64(p + 2 * (len)));                   \
            p += 8;                                                                \
        } while (p < end);                                                         \
        c0 = bmq_crc32c_shift(shift_table, (uint32_t)c0) ^ (uint32_t)c1;           \
        c0 = bmq_crc32c_shift(shift_table, (uint32_t)c0) ^ (uint32_t)c2;           \
        p += 2 * (len);                                                            \
        n -= 3 * (size_t)(len);                                                    \
    }

/* "crc32" as well: clang (zig cc, which builds the manylinux wheels) wants it for _mm_crc32_*. */
__attribute__((target("sse4.2,crc32")))
static uint32_t bmq_crc32c_hw(uint32_t reg, const unsigned char *p, size_t n) {
    uint64_t c0 = reg;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    BMQ_CRC32C_3WAY(BMQ_CRC32C_LONG, bmq_crc32c_long_shift)
    BMQ_CRC32C_3WAY(BMQ_CRC32C_SHORT, bmq_crc32c_short_shift)
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, bmq_load_u64(p));
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#else
#define BMQ_CRC32C_HW_POSSIBLE 0
#endif

static void bmq_crc32c_init(void) {
    uint32_t i, k, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ BMQ_CRC32C_POLY : c >> 1;
        bmq_crc32c_table[0][i] = c;
    }
    for (i = 0; i < 256; i++) {
        c = bmq_crc32c_table[0][i];
        for (k = 1; k < 8; k++) {
            c = bmq_crc32c_table[0][c & 0xFF] ^ (c >> 8);
            bmq_crc32c_table[k][i] = c;
        }
    }
    bmq_crc32c_fill_shift(bmq_crc32c_long_shift, BMQ_CRC32C_LONG);
    bmq_crc32c_fill_shift(bmq_crc32c_short_shift, BMQ_CRC32C_SHORT);
#if BMQ_CRC32C_HW_POSSIBLE
    {
        /* cpuid, not __builtin_cpu_supports: zig cc (the manylinux wheels' compiler) cannot link
           the latter's __cpu_model into a shared object. */
        unsigned int eax, ebx, ecx, edx;
        bmq_crc32c_have_hw = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2) ? 1 : 0;
    }
#endif
}

/* Selects the engine at run time; `force_sw` lets tests cross-check the fallback. */
static uint32_t bmq_crc32c_ex(uint32_t crc, const void *data, size_t n, int force_sw) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t reg = ~crc;
#if BMQ_CRC32C_HW_POSSIBLE
    if (bmq_crc32c_have_hw && !force_sw)
        return ~bmq_crc32c_hw(reg, p, n);
#endif
    return ~bmq_crc32c_sw(reg, p, n);
}

static inline uint32_t bmq_crc32c(uint32_t crc, const void *data, size_t n) {
    return bmq_crc32c_ex(crc, data, n, 0);
}

#endif
