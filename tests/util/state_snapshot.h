/* A byte image of an engine's training state, through its mt_state_io (every tensor's fp32
 * weights and optimizer parts, in table order) and of the host upload copy, for tests that compare
 * states bit for bit. */
#ifndef MT_TEST_STATE_SNAPSHOT_H
#define MT_TEST_STATE_SNAPSHOT_H

#include <stddef.h>

#include "engine/engine.h"

typedef struct {
    size_t bytes;
    unsigned char *data;
} mt_test_snapshot;

/* Waits for the engine's update first. */
void mt_test_snapshot_state(mt_test_snapshot *s, mt_engine *e, const mt_param_table *t);
/* The upload arenas of the host groups (what the next forward loads). */
void mt_test_snapshot_upload(mt_test_snapshot *s, mt_engine *e, const mt_param_table *t);
void mt_test_snapshot_free(mt_test_snapshot *s);
/* cmocka asserts: equal bytes. */
void mt_test_snapshot_equal(const mt_test_snapshot *a, const mt_test_snapshot *b);

#endif
