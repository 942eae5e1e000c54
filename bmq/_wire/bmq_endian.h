/* Big-endian loads and stores on unaligned memory: the wire is big-endian and nothing on it
 * is guaranteed to be aligned, so every access goes through memcpy (compiled to one mov). */
#ifndef BMQ_ENDIAN_H
#define BMQ_ENDIAN_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define BMQ_BE16(x) (x)
#define BMQ_BE32(x) (x)
#define BMQ_BE64(x) (x)
#else
#define BMQ_BE16(x) __builtin_bswap16(x)
#define BMQ_BE32(x) __builtin_bswap32(x)
#define BMQ_BE64(x) __builtin_bswap64(x)
#endif

static inline uint16_t bmq_load_be16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return BMQ_BE16(v);
}

static inline uint32_t bmq_load_be32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return BMQ_BE32(v);
}

static inline uint64_t bmq_load_be64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return BMQ_BE64(v);
}

static inline void bmq_store_be16(unsigned char *p, uint16_t v) {
    v = BMQ_BE16(v);
    memcpy(p, &v, 2);
}

static inline void bmq_store_be32(unsigned char *p, uint32_t v) {
    v = BMQ_BE32(v);
    memcpy(p, &v, 4);
}

static inline void bmq_store_be64(unsigned char *p, uint64_t v) {
    v = BMQ_BE64(v);
    memcpy(p, &v, 8);
}

#endif
