/* kd_store.h - launches drained from the ring, kept in order for reading.
 *
 * A growable array of payloads plus the offset of each launch header.  The
 * store grows only when the ring is drained (when the user reads results),
 * never on the launch path.
 */
#ifndef KD_STORE_H
#define KD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kd_record.h"

typedef struct kd_store {
    kd_payload *payloads;
    uint64_t npayloads;
    uint64_t payload_cap;
    uint64_t *launch_off; /* header offset of launch i */
    uint64_t nlaunches;
    uint64_t launch_cap;
} kd_store;

void kd_store_init(kd_store *s);
void kd_store_free(kd_store *s);
void kd_store_clear(kd_store *s);

/* Appends one launch (n payloads, header first).  Returns 0, or -1 when out
 * of memory (nothing appended). */
int kd_store_append(kd_store *s, const kd_payload *p, uint32_t n);

/* Drops the first n launches (all of them when n >= nlaunches); the rest
 * move to the front, in order (launch i becomes launch i - n).  Never
 * allocates. */
void kd_store_drop_front(kd_store *s, uint64_t n);

/* Header payload of launch i (i < nlaunches); args follow it. */
static inline const kd_payload *kd_store_launch(const kd_store *s, uint64_t i)
{
    return &s->payloads[s->launch_off[i]];
}

/* Offset (from the header) of the payload that starts argument k of a launch,
 * or 0 when k is out of range. */
uint32_t kd_launch_arg_offset(const kd_payload *launch, uint32_t k);

#endif
