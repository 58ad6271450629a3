/* kd_crc32.h - CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of trace
 * chunks.  Python-free. */
#ifndef KD_CRC32_H
#define KD_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* The CRC of p[0..n): carry-less multiplication where the CPU has it, else
 * slicing by 8. */
uint32_t kd_crc32(const uint8_t *p, size_t n);
/* The same, slicing by 8 only (for tests). */
uint32_t kd_crc32_portable(const uint8_t *p, size_t n);

#endif
