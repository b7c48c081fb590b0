/* nabla — CRC32C (Castagnoli), as TFRecord files use it, and its masked form.
 * Internal to the library. */
#ifndef NB_DATA_CRC32C_H
#define NB_DATA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes at data and returns the new CRC32C
 * (reflected polynomial 0x82F63B78, initial and final xor 0xFFFFFFFF):
 * nb__crc32c(0, "123456789", 9) is 0xE3069283. data may be NULL when n is 0.
 * Thread-safe; never fails. */
uint32_t nb__crc32c(uint32_t crc, const void *data, size_t n);

/* The masked CRC TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t nb__crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* The masked CRC32C of n bytes at data. */
static inline uint32_t nb__crc32c_masked(const void *data, size_t n)
{
    return nb__crc32c_mask(nb__crc32c(0, data, n));
}

#endif
