/* kd_grow.h - grow a malloc'd array geometrically (the store, the trace
 * reader's indexes and the trace writer's string map).  Python-free. */
#ifndef KD_GROW_H
#define KD_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Makes *buf hold at least `need` elements of `elem` bytes (doubling from 256).
 * Returns 0, or -1 when out of memory (*buf and *cap unchanged). */
static inline int kd_grow(void **buf, uint64_t *cap, uint64_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    uint64_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *p = realloc(*buf, c * elem);
    if (p == NULL)
        return -1;
    *buf = p;
    *cap = c;
    return 0;
}

#endif
