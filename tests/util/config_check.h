/* The config tests' shared steps: a config.json under the fixtures loaded, inline JSON parsed or
 * refused by name, the save round trip. A failure fails the running cmocka test with
 * mt_error_message(). */
#ifndef MT_TEST_CONFIG_CHECK_H
#define MT_TEST_CONFIG_CHECK_H

#include "backend/backend.h"
#include "model/config.h"

/* mt_config_load of mt_fixture_path(printf(fmt, ...)), which must succeed. */
mt_config mt_test_config_load(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* mt_config_parse of json (as "c.json"), which must succeed. */
mt_config mt_test_config_parse(const char *json);
/* mt_config_parse of json (as "c.json") must fail with an error message that contains says. */
void mt_test_config_refused(const char *json, const char *says);
/* a saved (as config.json in a fresh temporary directory) and loaded back is a again, every byte
 * (the layer bits included). */
void mt_test_config_roundtrip(const mt_config *a);
/* A backend without c's ops refuses it: mt_layer_backend_check(c, be) fails with a message that
 * names says (the model type) and points to --device cpu. */
void mt_test_backend_refused(const mt_config *c, const mt_backend *be, const char *says);

#endif
