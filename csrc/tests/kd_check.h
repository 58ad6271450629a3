/* kd_check.h - the CHECK macros of the C core's test programs (one program
 * per file, so the counters are per program). */
#ifndef KD_CHECK_H
#define KD_CHECK_H

#include <stdio.h>
#include <string.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                            \
    do {                                                                       \
        checks++;                                                              \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
        }                                                                      \
    } while (0)

#define CHECK_STR(got, want)                                                   \
    do {                                                                       \
        checks++;                                                              \
        if (strcmp((got), (want)) != 0) {                                      \
            failures++;                                                        \
            fprintf(stderr, "%s:%d: got \"%s\", want \"%s\"\n", __FILE__,      \
                    __LINE__, (got), (want));                                  \
        }                                                                      \
    } while (0)

#endif
