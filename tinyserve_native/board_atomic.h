/*
 * Atomic accessors for the shared-memory board (board.pyx), on GCC/Clang builtins.
 *
 * Every field of the board is read and written through these, even where a plain access
 * would do on x86: the board is shared between processes, and a plain access to memory
 * another process writes is a data race as far as the compiler is concerned (it may tear
 * it, cache it in a register, or reorder it past the seqlock counter).
 */
#ifndef TINYSERVE_BOARD_ATOMIC_H
#define TINYSERVE_BOARD_ATOMIC_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t tsb_load_u64_acquire(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline uint64_t tsb_load_u64(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void tsb_store_u64_release(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void tsb_store_u64(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* Acquire-release on success: the writes that follow cannot move above the exchange. */
static inline int tsb_cas_u64(uint64_t *p, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_RELAXED);
}

static inline int64_t tsb_load_i64_acquire(const int64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline int64_t tsb_load_i64(const int64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void tsb_store_i64_release(int64_t *p, int64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void tsb_store_i64(int64_t *p, int64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline int tsb_cas_i64(int64_t *p, int64_t expected, int64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_RELAXED);
}

static inline uint32_t tsb_load_u32(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void tsb_store_u32(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* The generic (non-_n) builtins take any 8-byte type, so a double needs no punning. */
static inline double tsb_load_f64(const double *p) {
    double v;
    __atomic_load(p, &v, __ATOMIC_RELAXED);
    return v;
}

static inline void tsb_store_f64(double *p, double v) {
    __atomic_store(p, &v, __ATOMIC_RELAXED);
}

/* Byte-wise relaxed copies for the frontend id: tiny, and race-free by the book. */
static inline void tsb_load_bytes(char *dst, const char *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

static inline void tsb_store_bytes(char *dst, const char *src, size_t n) {
    for (size_t i = 0; i < n; i++) __atomic_store_n(&dst[i], src[i], __ATOMIC_RELAXED);
}

static inline void tsb_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }

#endif /* TINYSERVE_BOARD_ATOMIC_H */
