/* kd_launch_table.h - the launch table: the launches of one run in order,
 * with the generation that makes a (table, index) name one record, and the
 * digests compare reads from them.  Filled by the live recorder (each drain)
 * and by the trace reader (kd_ltab_fill_trace) alike.  Python-free.
 *
 * Note [Launch table]
 * A run's kernel launches are decoded payloads (kd_record.h: a header, then
 * per argument its payloads), kept in one growable store (kd_store.h) with
 * string ids of the process-wide string table and hash spec ids of this
 * process.  Two producers fill it: the recorder, which drains its ring into
 * the table inside it (kd_recorder.table), and a trace's reader, which
 * decodes launch records into a table of their own (file string ids and spec
 * ids mapped to this process's on the way in): the LaunchTable a kdebug.Run
 * holds (kd_launch_table_py.c), a table with no ring, no hooks and no
 * counters.  Either way a kernel record is a Launch view of (table, index)
 * (kd_view.c), and the same code renders it.  Clearing the
 * table (dm.operators = [], reset) starts a new generation: a store index
 * names a record only together with the generation it was taken in (Note
 * [Launch views keep their record] in kd_view.c).
 *
 * What compare needs of a launch is its five digests (KD_DG_* in
 * kd_trace.h: identity, config, shapes, hashes before, hashes after), and
 * kd_launch_digests() is the one function that computes them, from decoded
 * payloads: the reader calls it on each launch record while it validates a
 * file (so a trace's digest column is what it always was), and a live run's
 * launches are digested from the table when compared, with no trace bytes
 * encoded in between.  Strings enter a digest through their bytes (the
 * caller's kd_str_digest_fn: file ids for the reader, global ids for the
 * table), so equal launches give equal digests whichever way they came in;
 * a hash side still pending on the GPU counts as absent, as the trace writer
 * leaves it out. */
#ifndef KD_LAUNCH_TABLE_H
#define KD_LAUNCH_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "kd_record.h"
#include "kd_store.h"
#include "kd_strtab.h"
#include "kd_trace.h"

typedef struct kd_ltab {
    kd_store store;      /* launch payloads, global string ids */
    uint64_t generation; /* clears so far: a store index names a record only with it */
} kd_ltab;

void kd_ltab_init(kd_ltab *t);
void kd_ltab_free(kd_ltab *t);
/* Empties the table and starts a new generation. */
void kd_ltab_clear(kd_ltab *t);
/* Drops the oldest n launches and starts a new generation (store indices
 * shift down by n: Note [Flight recorder] in kdebug/flight.py). */
void kd_ltab_forget(kd_ltab *t, uint64_t n);

/* The digest of string `id` (kd_dg_bytes of its bytes) in the caller's id space. */
typedef uint64_t (*kd_str_digest_fn)(const void *ctx, uint32_t id);

/* The KD_DG_N digests of decoded launch p[0..n) (Note [Launch table]). */
void kd_launch_digests(const kd_payload *p, uint32_t n, kd_str_digest_fn sdg, const void *ctx,
                       uint64_t out[KD_DG_N]);

/* kd_str_digest_fn over a kd_strtab (ctx: the table): the table's ids. */
uint64_t kd_strtab_digest(const void *strtab, uint32_t id);

/* Digests of launches [start, stop) of t into out (KD_DG_N per launch), the
 * strings looked up in `strings`.  Returns the number of launches digested. */
uint64_t kd_ltab_digests(const kd_ltab *t, uint64_t start, uint64_t stop, const kd_strtab *strings,
                         uint64_t *out);

/* One digest of launches [start, stop) of t (clamped to the table): their
 * count and, for each, its identity, shapes / scalars and hashes after
 * (KD_DG_KEY, KD_DG_SHAPE, KD_DG_POST), combined in any order (a sum), so
 * launches from two threads interleaved differently give the same digest
 * (Note [Flight recorder] in kdebug/flight.py). */
uint64_t kd_ltab_range_digest(const kd_ltab *t, uint64_t start, uint64_t stop, const kd_strtab *strings);

/* kd_ltab_range_digest in parts, for launches that do not all lie in one
 * table (Note [Steps held in the ring]): the term one launch (n contiguous
 * payloads, header first) adds to the sum, and the digest of a sum of
 * `count` such terms.  kd_ltab_range_digest(t, a, b) is
 * kd_digest_finish(sum of the terms of launches a..b-1, b - a). */
uint64_t kd_launch_digest_term(const kd_payload *p, uint32_t n, const kd_strtab *strings);
uint64_t kd_digest_finish(uint64_t sum, uint64_t count);

/* Maps a trace's ids to this process's while it fills a table: file string
 * id -> global id (interned into `strings` on first use; map[nstr + 1] zeroed
 * by the caller) and written hash spec id -> this process's (spec[0..nspec),
 * ids at or past nspec become 0: unknown). */
typedef struct kd_ltab_ids {
    kd_strtab *strings;
    uint32_t *map;
    const uint16_t *spec;
    uint32_t nspec;
} kd_ltab_ids;

/* Appends the launch records among records [start, stop) of r to t, with ids
 * mapped by `ids`; record indices go to rec_index[0..) (room for stop - start).
 * Returns the number appended, or -1 out of memory, -2 a record that does not
 * decode (t keeps what was appended before). */
int64_t kd_ltab_fill_trace(kd_ltab *t, const kd_tr *r, uint64_t start, uint64_t stop, kd_ltab_ids *ids,
                           uint64_t *rec_index);

#endif
