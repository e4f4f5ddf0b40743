/* cmocka needs these before its header. */
#ifndef MT_CMOCKA_INCLUDES_H
#define MT_CMOCKA_INCLUDES_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#endif
