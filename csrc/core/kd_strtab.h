/* kd_strtab.h - interned strings: kernel names, argument names, launch configs.
 *
 * Ids are dense, start at 1 (0 means "no string") and never change, so records
 * hold 4-byte ids instead of pointers.  Interning takes a mutex and may
 * allocate (a new arena chunk, a larger hash index); it happens when a kernel
 * is first seen, not per launch.  kd_strtab_get is lock-free: an id is only
 * handed out after its string is written and published.
 */
#ifndef KD_STRTAB_H
#define KD_STRTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct kd_strtab kd_strtab;

/* Returns a new table able to hold up to max_strings strings, or NULL. */
kd_strtab *kd_strtab_new(uint32_t max_strings);
void kd_strtab_free(kd_strtab *t);

/* Returns the id of s[0..len), adding it if new; 0 if the table is full or out
 * of memory (the caller counts that as an error).  s need not be
 * NUL-terminated and may not contain NUL. */
uint32_t kd_strtab_intern(kd_strtab *t, const char *s, size_t len);

/* The NUL-terminated string of id, or "" for 0 and unknown ids; *len gets its
 * length if len is not NULL. */
const char *kd_strtab_get(const kd_strtab *t, uint32_t id, size_t *len);

/* Number of strings (ids 1..count are valid). */
uint32_t kd_strtab_count(const kd_strtab *t);

#endif
